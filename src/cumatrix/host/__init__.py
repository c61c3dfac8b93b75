"""Facts about this host: the real driver, its GPUs, the compiler, the runtimes found here."""
