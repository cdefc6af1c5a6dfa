"""What a training step computes and what a device can: the update's model FLOPs and a device's peak FLOP/s (MFU)."""
