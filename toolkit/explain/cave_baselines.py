"""2D baselines for CAVE: a CNN with the same backbone and a linear head on globally pooled features, explained by
  * CRAFT-lite concepts (Fel et al., CVPR 2023, https://github.com/deel-ai/Craft): per class, NMF of the
    non-negative feature-map activations of its training images, A ~ U W; each feature-map position plays the
    role of CRAFT's crop (its receptive field is the patch), and a test image's concept maps are its U
    coefficients (non-negative least squares against W), upsampled to the image;
  * Grad-CAM (Selvaraju et al., ICCV 2017) of the image's class at the last conv layer: one map per class;
  * LRP of the class logit with the same rules as CAVE's LRP explanation (`baseline_lrp`): one map.
All maps go through the same 3D-C code as CAVE's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.explain.cave import Backbone, as_tensor_images, log, split_accuracy


class Cnn2d(nn.Module):
    def __init__(self, feature_dim: int, n_classes: int, width: int = 32):
        super().__init__()
        self.backbone = Backbone(feature_dim, width)
        self.head = nn.Linear(feature_dim, n_classes)

    def activations(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.backbone(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.activations(x).mean((2, 3)))


def train_cnn(images: torch.Tensor, labels: torch.Tensor, n_classes: int, feature_dim: int, width: int,
              epochs: int, batch_size: int, lr: float, seed: int, progress) -> Cnn2d:
    generator = torch.Generator().manual_seed(seed)
    model = Cnn2d(feature_dim, n_classes, width)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in progress(range(epochs), total=epochs, description="2D CNN baseline"):
        model.train()
        total = 0.0
        for batch in torch.randperm(len(images), generator=generator).split(batch_size):
            loss = F.cross_entropy(model(images[batch]), labels[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        log.info("2D CNN epoch %d: loss %.4f", epoch + 1, total / len(images))
    return model.eval()


def grad_cam(model: Cnn2d, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ReLU(sum_c alpha_c A_c) with alpha_c the spatial mean gradient of the class logit; (N, 1, S, S)."""
    activations = model.activations(images).detach().requires_grad_(True)
    logits = model.head(activations.mean((2, 3)))
    grads, = torch.autograd.grad(logits.gather(1, labels[:, None]).sum(), activations)
    cam = F.relu((grads.mean((2, 3), keepdim=True) * activations).sum(1, keepdim=True)).detach()
    return F.interpolate(cam, size=images.shape[-2:], mode="bilinear", align_corners=False)


@torch.no_grad()
def lrp_maps(model: Cnn2d, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 32,
             top_rule: str = "epsilon") -> torch.Tensor:
    """LRP of the class logit with the composite CAVE's explanation uses (toolkit/explain/lrp.py): the linear head
    on the pooled ReLU features gives cell relevance a_ic w_yc / (h w) (LRP-0, bias dropped), then zbox / zplus /
    `top_rule` through the same backbone; (N, 1, S, S) summed over colour channels."""
    from toolkit.explain import lrp

    model.eval()
    layers = lrp.fold_sequential(model.backbone.net)
    rules = lrp.default_rules(len(layers), top_rule)
    out = []
    for i in range(0, len(images), batch_size):
        x, y = images[i:i + batch_size], labels[i:i + batch_size]
        inputs, z = lrp.forward_inputs(layers, x)
        a = F.relu(z)
        relevance = a * model.head.weight[y][:, :, None, None] / (a.shape[2] * a.shape[3])
        out.append(lrp.lrp_backward(layers, inputs, relevance[:, None], rules).sum(2))
    return torch.cat(out)


def nmf_concepts(activations: np.ndarray, n_concepts: int, seed: int) -> np.ndarray:
    """W (D, d): NMF dictionary of non-negative activations (P, d)."""
    from sklearn.decomposition import NMF

    return NMF(n_concepts, init="nndsvda", max_iter=400, random_state=seed).fit(activations).components_


def nmf_coefficients(activations: np.ndarray, dictionary: np.ndarray) -> np.ndarray:
    """U >= 0 minimising ||A - U W||_F for a fixed W, row by row (scipy's exact NNLS); (P, D)."""
    from scipy.optimize import nnls

    return np.stack([nnls(dictionary.T, row)[0] for row in activations])


@torch.no_grad()
def craft_maps(model: Cnn2d, train_images, train_labels, images, labels, n_classes, n_concepts, seed):
    """NMF concept maps of each image's class: (N, D, S, S)."""
    dictionaries = []
    for c in range(n_classes):
        acts = model.activations(train_images[train_labels == c]).permute(0, 2, 3, 1)
        acts = acts.reshape(-1, model.head.in_features)
        dictionaries.append(nmf_concepts(acts.numpy(), n_concepts, seed))
    feats = model.activations(images).permute(0, 2, 3, 1).numpy()  # (N, h, w, d)
    n, h, w, d = feats.shape
    maps = np.stack([nmf_coefficients(feats[i].reshape(-1, d), dictionaries[labels[i]]).T.reshape(-1, h, w)
                     for i in range(n)])
    return F.interpolate(torch.from_numpy(maps).float(), size=images.shape[-2:], mode="bilinear",
                         align_corners=False).numpy()


def baseline_rows(config, data, ctx):
    """(method, accuracies, maps on the iid test split) for CRAFT-lite NMF and Grad-CAM on one trained CNN."""
    train = np.nonzero(data["split"] == "train")[0]
    test = np.nonzero(data["split"] == "test")[0]
    n_classes = len(data["classes"])
    train_images, train_labels = as_tensor_images(data["images"][train]), torch.from_numpy(data["labels"][train])
    model = train_cnn(train_images, train_labels, n_classes, config.feature_dim, config.width, config.baseline_epochs,
                      config.batch_size, config.lr, ctx.seed, ctx.progress)
    accuracy = split_accuracy(lambda x: torch.cat([model(x[i:i + 128]).argmax(1) for i in range(0, len(x), 128)]),
                              data)
    test_images, test_labels = as_tensor_images(data["images"][test]), torch.from_numpy(data["labels"][test])
    craft = craft_maps(model, train_images, train_labels, test_images, test_labels, n_classes,
                       config.concepts_per_class, ctx.seed)
    cam = grad_cam(model, test_images, test_labels).numpy()
    rows = [("2D CNN + NMF concepts (CRAFT-lite)", accuracy, craft), ("2D CNN + Grad-CAM", accuracy, cam)]
    if config.baseline_lrp:
        rows.append(("2D CNN + LRP", accuracy, lrp_maps(model, test_images, test_labels,
                                                          top_rule=config.lrp_top_rule).numpy()))
    return rows
