"""Image segmentation techniques (MBU-Net: masked binary U-Net with bit-packed kernels)."""
