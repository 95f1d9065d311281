"""The trainee runtime: the training process's side of gpusnap between boot and exit (see
``gpusnap.capture``)."""
