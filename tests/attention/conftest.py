"""(The settings grid's summary line is printed by ``tests/conftest.py``, which also sees the
parallel workers' times.)"""
