"""Transfer learning the Lightning way: a LightningModule with a `backbone` and a head, and
Lightning's BackboneFinetuning callback, which freezes the backbone before training, unfreezes it
at --unfreeze-at and adds it to the optimizer as a parameter group at a tenth of the rate, then
raises that group's rate each epoch. SGD with momentum, a shuffled DataLoader.
usage: lightning_finetune.py OUT [--epochs N] [--unfreeze-at E]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning as L
from lightning.pytorch.callbacks import BackboneFinetuning
import torch
from common import finish, progress


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.ReLU(), torch.nn.Linear(24, 12), torch.nn.ReLU())
        self.head = torch.nn.Linear(12, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(self.backbone(x)), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.05, momentum=0.9)


class Progress(L.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        progress(trainer.global_step)


def main():
    parser = argparse.ArgumentParser(description="fine-tuning with BackboneFinetuning")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--unfreeze-at", type=int, default=2)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    x = torch.randn(320, 8)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    model = Classifier()
    progress_callback = Progress()
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=args.unfreeze_at, lambda_func=lambda epoch: 1.5,
                                    backbone_initial_ratio_lr=0.1, should_align=False, verbose=False)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[finetuning, progress_callback],
        default_root_dir=args.out,
    )
    trainer.fit(model, loader)
    finish(
        model=model.state_dict(),
        optimizer=trainer.optimizers[0].state_dict(),
        loops=trainer.fit_loop.state_dict(),
        losses=progress_callback.losses,
        backbone_lr=finetuning.previous_backbone_lr,
        steps=trainer.global_step,
    )


if __name__ == "__main__":
    main()
