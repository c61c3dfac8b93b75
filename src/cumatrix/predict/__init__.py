"""Stage two, predict: what each cell should do, from NVIDIA's rules and each variant's mechanics."""
