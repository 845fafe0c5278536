"""Task data: one module per LRA task (``listops``, ``text``, ``retrieval``, ``image``, ``pathfinder``
with its generator ``pathfinder_gen``), the shared DataModule (``datamodule``), the build-once cache
(``cache``), readers (``bytes``, ``tfds_source``), the seeded sampler and progress lines, ``layout``
(where each reader looks and what it reads, shared with the fetch), and the fetch itself.

May import: the top-level ``lra`` modules. Never models, attention, training, bench or report.
"""
