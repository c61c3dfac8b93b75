"""The static audit of `cumatrix gate`: what each ELF file of a wheel needs from CUDA."""
