"""Memformer mutants: memory write, memory recurrence, MRBP, padding and classification bugs."""
from __future__ import annotations

from tests.mutants import Mutant

MEM = "attention/memformer.py"
ENC = "models/memory_encoder.py"
TESTS = ("tests/attention/test_attention_memformer.py",)

MUTANTS = [
    Mutant("memformer-write-without-own-slot", MEM,
           "w = torch.softmax(torch.cat([own, tok], dim=-1), dim=-1)\n        slots = w[..., :1] * vs + w[..., 1:] @ v",
           "w = torch.softmax(tok, dim=-1)\n        slots = w @ v",
           "slot attention without the slot's own key/value term (Fig. 2c)", TESTS),
    Mutant("memformer-write-unscaled", MEM,
           "self.scale = 1.0 / math.sqrt(d // n_heads)", "self.scale = 1.0",
           "slot attention logits without the 1/sqrt(d_h) scale", TESTS),
    Mutant("memformer-padded-tokens-written", MEM,
           "tok = qs @ k.transpose(-1, -2) * self.scale + key_bias(mask, qs.dtype)",
           "tok = qs @ k.transpose(-1, -2) * self.scale",
           "padded tokens are written into the memory", TESTS),
    Mutant("memformer-empty-segment-overwrites", MEM,
           "return torch.where(mask.any(1)[:, None, None], new, mem)", "return new",
           "a segment without a real token rewrites the memory (outputs depend on the padding amount)", TESTS),
    Mutant("memformer-per-layer-writes-queries", MEM,
           "self.carry = self.writer(self.carry, k, v, mask)", "self.carry = self.writer(self.carry, q, v, mask)",
           "per-layer memory written from the queries instead of the keys", TESTS),
    Mutant("memformer-per-layer-stale-read", MEM,
           "return torch.stack(mems, 1)", "return torch.stack(mems[:1] + mems[:-1], 1)",
           "standalone per-layer mixer: segment t reads M_{t-1} (the memory of the wrong segment)", TESTS),
    Mutant("memformer-memory-not-carried", ENC,
           "states.append(tuple(nxt))", "states.append(states[-1])",
           "the memory is not carried across segments (every segment reads M_0)", TESTS),
    Mutant("memformer-unified-stale-read", ENC,
           "h, *nxt = run(xt, pt, *states[-1])",
           "h, *nxt = run(xt, pt, *states[max(0, len(states) - 2)])",
           "unified memory read from the wrong segment (one step late)", TESTS),
    Mutant("memformer-write-before-final-norm", ENC,
           "return (h, self.memory.write(mem, h, pad.mask))", "return (h, self.memory.write(mem, x, pad.mask))",
           "the unified memory is written from the un-normalised residual stream, not the final hidden states",
           TESTS),
    Mutant("memformer-one-reader-for-all-layers", ENC,
           "zip(self.encoder.blocks, self.memory.readers)",
           "zip(self.encoder.blocks, [self.memory.readers[0]] * len(self.memory.readers))",
           "every layer reads the memory through the first layer's cross-attention", TESTS),
    Mutant("memformer-mrbp-drops-memory-gradient", ENC,
           "return checkpoint(self.step, *args, use_reentrant=False)",
           "return checkpoint(self.step, *args[:3], *(s.detach() for s in args[3:]), use_reentrant=False)",
           "MRBP back-propagates the local loss only, not dL/dM_{t+1} (Algorithm 1 line 12)", TESTS),
    Mutant("memformer-mrbp-keeps-activations", ENC,
           "if self.mrbp and self.training and torch.is_grad_enabled():",
           "if False and self.mrbp and self.training and torch.is_grad_enabled():",
           "mrbp: true silently trains with full BPTT (keeps every activation)", TESTS),
    Mutant("memformer-cls-in-first-segment", "models/network.py",
           'MemformerEncoder(encoder, summary_first=pool == "cls")', "MemformerEncoder(encoder, summary_first=False)",
           "CLS pooling reads the token in segment 0, which never sees the later segments", TESTS),
]
