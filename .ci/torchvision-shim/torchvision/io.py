from torchvision import module_getattr

__getattr__ = module_getattr("io")
