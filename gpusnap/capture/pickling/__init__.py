"""The object-graph pickler (``pickler``) and the reducers that send memory to buffers
(``reducers``)."""
