"""The report (``run.py mode=report``): its settings (``arguments``), record validation
(``screening``), cells of one experiment each (``cells``), accuracy tables, tests and marks
(``accuracy``, ``comparisons``, ``lengths``, ``stats``, ``protocols``), speed/memory tables and the
SMAT score (``efficiency``, ``smat``), published numbers (``reference``), table rendering
(``tables``), plots, orchestration (``build``) and the W&B push (``wandb_push``).

May import: ``lra.records``, ``lra.files``, ``lra.badinput``, ``lra.stamp`` and ``lra.identity`` only
(plus its own modules): a report is built from run records alone, so it never imports training,
bench, data, models or attention. The one definition it shares with training, the experiment
identity, lives at the top in :mod:`lra.identity` and both import it.
"""
