"""Isolated execution: a fork server (``spawner``) and what each child does to itself.

The trio process never forks. ``spawner.start`` forks the spawner before trio starts;
``SpawnRunner`` (in the trio process) asks it for a child per call and reads the
child's framed messages (output chunks, then one result) from a pipe it owns.
"""
