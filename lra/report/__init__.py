"""The report (``run.py mode=report``): accuracy tables with statistics (``accuracy``, ``stats``,
``protocols``), speed/memory tables and the SMAT score (``build``, ``smat``), published numbers
(``reference``), table rendering (``tables``), plots and the W&B push (``wandb_push``).

May import: ``lra.records`` and ``lra.files`` only (plus its own modules): a report is built from run
records alone, so it never imports training, bench, data, models or attention.
"""
