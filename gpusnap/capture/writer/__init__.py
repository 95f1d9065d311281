"""The writer process: forked from the trainee (``fork``), writing the snapshot while training
goes on (``process``), watched by the trainee (``watchdog``)."""
