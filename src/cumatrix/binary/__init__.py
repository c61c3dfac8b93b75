"""Reading binaries: ELF files and the device code in their fatbins, for the gate and the observation."""
