import torch


def example(batch_size=None):
    return torch.nn.Linear(4, 4)
