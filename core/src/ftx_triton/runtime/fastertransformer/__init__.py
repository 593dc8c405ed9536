"""FasterTransformer runtimes: the layer both launchers share (GPUs, MPI hosts, log scan, GEMM
tuning) and the launchers themselves, ``docker`` and ``native``, which know only this layer."""
