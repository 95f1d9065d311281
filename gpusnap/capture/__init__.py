"""The capture side: everything in the trainee that takes a snapshot, one job per folder.

- ``trainee``: the runtime in the training process: ``agent`` (installed at boot, handles a
  request at a safe point and runs the stall), ``session`` (its state), ``control`` (the socket
  to the supervisor and the signals), ``costs``, ``pace``, ``witness``, ``children``,
  ``loopnotes`` (how each loop can be brought back) and ``paths`` (object paths for the manifest).
- ``safepoints``: where a snapshot may be taken: ``returnable`` (frames replay can return to) and
  ``steploop`` (which loop is the step loop; the optimizer hooks).
- ``writer``: the writer process: ``fork`` (the fork window and the stall's end), ``process``
  (what the forked writer does) and ``watchdog`` (the trainee's watch on it).
- ``dist``: global snapshots of a torchrun job: ``plan`` (pure: where the ranks meet),
  ``coordinator`` (its threads and the c10d store) and ``check`` (what is read there, checked).
- ``pickling``: the object-graph pickler (``pickler``) and its buffer reducers (``reducers``).
"""
