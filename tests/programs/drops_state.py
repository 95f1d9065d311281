"""A loop over an object whose __getstate__ leaves out what the loop needs (as a framework's
iterator may): a restart that merged that state would fail in its first iteration.
usage: drops_state.py OUT"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from notorch.pace import finish, progress


class Table:
    def __init__(self, n):
        self.rows = list(range(n))

    def __getstate__(self):
        return {**self.__dict__, "rows": None}  # written for sending a copy elsewhere


table = Table(400)
total = 0
for step in range(400):
    total += table.rows[step]
    progress(step + 1)
finish(total=total)
