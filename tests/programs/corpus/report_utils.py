"""late_import.py's reporting helpers, imported inside its loop: the summaries and the best
epoch so far live here."""
HISTORY = []
BEST = {"loss": float("inf"), "epoch": -1}
MARGIN = 0.999


def summarize(epoch, loss):
    """Record the epoch; True when it beat the best by the margin."""
    HISTORY.append((epoch, round(loss, 6)))
    if loss < BEST["loss"] * MARGIN:
        BEST.update(loss=loss, epoch=epoch)
        return True
    return False
