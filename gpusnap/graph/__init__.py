"""The program's object graph, shared by capture and restore (neither owns it).

- ``iterpickle``: an iterative pickler that writes standard pickle opcodes from an explicit
  stack, for graphs too deep for the C pickler (a 100,000-long linked structure);
- ``walk``: one iterative, identity-memoized traversal of an object's children, used by the
  path naming, the merge and the item digests;
- ``load``: what a snapshot's pickle stream refers to (tensor, storage and array rebuilders, the
  placeholders ``LiveOnly`` and ``Unbuilt``) and ``load_graph``;
- ``roots``: the frames, module globals and loops a snapshot starts its graph from;
- ``rng``: the global random number generators' states (and those of generators a data source
  owns), taken at safe points and loop starts, given back by restore;
- ``digest``: xxh3 digests of loop items, taken by the writer and compared by replay.
- ``settings`` and ``warned``: what the program changed process-wide (its environment, torch's
  threads, print options...) and the warnings it was shown once per place, put back by restore.

Every walk here handles cycles, sharing and depth without Python's recursion limit: real
programs are full of back references (argparse, nn.Module trees, framework trainers).
"""
