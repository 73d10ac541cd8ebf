def accuracy(logits, target):
    return (logits.argmax(1) == target).float().mean().item()
