"""CAVE: Concept-Aware Volumes for Explanations (Pham, Jesslen, Schiele, Kortylewski, Fischer).

Paper: https://arxiv.org/abs/2503.13429 (OpenReview VSPLa2Sito); official code https://github.com/phamleyennhi/CAVE
(CUDA + pytorch3d, built on https://github.com/GenIntel/NOVUM). This is an independent CPU implementation:

1. a CNN backbone gives unit-norm feature maps F(x) (stride 4 here; ResNet-50, stride 8 in the paper);
2. every class owns a neural object volume (NOV): vertices on an ellipsoid fitted to the class mesh, each with a
   feature in a memory bank. NOVUM training: at the annotated pose, every visible vertex's projected pixel
   feature is pulled to its vertex feature against all other vertices of all classes (minus image-space
   neighbours of the same volume) and a queue of clutter (background) features, temperature 0.07; the bank follows
   the features with momentum 0.9; background features are pushed toward the clutter queue;
3. concepts: per class, K-means over the features of vertices visible in > 10% of its training images;
4. classifier (the official `FeatureMatchingCAVE` variant, picked explicitly): every pixel takes its best concept
   among all classes' concepts and K-means centres of the clutter queue; score cos/2 + 1/2; a class scores the
   sum over the pixels its concepts won, divided by its number of concepts. Pixels won by clutter count for no
   class, which is what keeps occluders from voting. `classifier="paper"` gives the paper's
   s_y = sum_i max_j cos(f_i, h_y^j) instead;
5. explanations: pixel-level concept relevance maps: (a) at the matching layer, each feature cell's contribution
   to the class score is shared among the class's concepts by a soft assignment, softmax over all concepts of
   cos/T (T = the training temperature), times the concept's match score, so the relevances sum to a soft version
   of the class score (`concept_relevance`); (b) default `explanation="lrp"`, the paper's NOV-aware LRP: each
   cell's relevance for concept h is shared over its feature channels in proportion to f_i * h (the paper's
   R_F(i, c) rule) and propagated layer by layer through the backbone with conservative LRP rules
   (toolkit/explain/lrp.py: zbox at the pixels, zplus in between, epsilon on the last conv), so every pixel map
   sums to its concept's relevance; `explanation="gaussian"`, the earlier stand-in: a conservative Gaussian
   upsampling of the cell relevances over their receptive field (`concept_relevance_maps`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.core.errors import require
from toolkit.explain.config import CaveConfig
from toolkit.explain.nov import (  # noqa: F401 - the NOV pieces, re-exported for CAVE's callers
    clutter_loss,
    ellipsoid_volume,
    momentum_update,
    nov_contrastive_loss,
    sample_features,
    visible_projection,
)
from toolkit.explain.render3d import NO_FACE

log = logging.getLogger("iclrkit")


class Backbone(nn.Module):
    """3x3 conv layers, stride 4 overall, d output channels (no final nonlinearity); the two extra layers at
    stride 4 widen the receptive field to ~29 px, enough to see where on a ~35 px object a patch sits."""

    def __init__(self, feature_dim: int, width: int = 32):
        super().__init__()
        widths = [3, width, 2 * width, 2 * width, 2 * width, 2 * width]
        layers: list[nn.Module] = []
        for (c_in, c_out), stride in zip(zip(widths, widths[1:]), (1, 2, 1, 2, 1)):
            layers += [nn.Conv2d(c_in, c_out, 3, stride, 1), nn.BatchNorm2d(c_out), nn.ReLU()]
        layers.append(nn.Conv2d(widths[-1], feature_dim, 3, 1, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# ---- concepts and classification ------------------------------------------------------------------------------

def kmeans_concepts(features: np.ndarray, n_concepts: int, seed: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    n = min(n_concepts, len(features))
    centres = KMeans(n, n_init=10, random_state=seed).fit(features).cluster_centers_
    return centres / np.linalg.norm(centres, axis=1, keepdims=True)


def concept_scores(features: torch.Tensor, concepts: torch.Tensor, concept_class: torch.Tensor, n_classes: int,
                   classifier: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """features (B, d, h, w) unit norm; concepts (M, d) unit norm with concept_class (M,) (-1: clutter).
    Returns class scores (B, C), the winning concept per pixel (B, h, w) and its score cos/2 + 1/2 (B, h, w)."""
    cos = torch.einsum("bdhw,md->bmhw", features, concepts)
    best_cos, winner = cos.max(dim=1)
    pixel_score = best_cos / 2 + 0.5
    if classifier == "paper":
        per_class = torch.stack([cos[:, concept_class == c].amax(1).sum((1, 2)) for c in range(n_classes)], 1)
        return per_class, winner, pixel_score
    won_by = concept_class[winner]  # (B, h, w)
    counts = torch.bincount(concept_class[concept_class >= 0], minlength=n_classes).clamp(min=1)
    per_class = torch.stack([(pixel_score * (won_by == c)).sum((1, 2)) for c in range(n_classes)], 1) / counts
    return per_class, winner, pixel_score


def concept_relevance(cos: torch.Tensor, concept_class: torch.Tensor, labels: torch.Tensor, classifier: str,
                      temperature: float) -> torch.Tensor:
    """Relevance R(i, h) of each feature cell i for the concepts h of each image's class, (B, D, h, w).
    repo: softmax over all concepts (clutter included) of cos/T at h, times cos_h/2 + 1/2, divided by the class's
    number of concepts; as T -> 0 the sum over cells and concepts is the repo class score.
    paper: softmax over the class's concepts, times max(cos_h, 0); as T -> 0 it sums to the positive part of
    s_y = sum_i max_j cos."""
    ids = torch.stack([torch.nonzero(concept_class == c)[:, 0] for c in range(int(concept_class.max()) + 1)])
    own_ids = ids[labels]  # (B, D)
    own_cos = torch.gather(cos, 1, own_ids[:, :, None, None].expand(-1, -1, *cos.shape[2:]))
    if classifier == "paper":
        return torch.softmax(own_cos / temperature, 1) * own_cos.clamp(min=0)
    share = torch.gather(torch.softmax(cos / temperature, 1), 1,
                         own_ids[:, :, None, None].expand(-1, -1, *cos.shape[2:]))
    return share * (own_cos / 2 + 0.5) / own_ids.shape[1]


def receptive_field_kernel(cells: int, size: int, sigma: float) -> torch.Tensor:
    """(cells*cells, size*size): row = how one feature cell's relevance spreads over image pixels, a Gaussian
    around the cell's centre, each row summing to 1 inside the image (conservative). sigma 0: the cell's own
    stride x stride pixels."""
    stride = size / cells
    centres = (torch.arange(cells, dtype=torch.float64) + 0.5) * stride
    pixels = torch.arange(size, dtype=torch.float64) + 0.5
    if sigma > 0:
        axis = torch.exp(-(centres[:, None] - pixels[None]) ** 2 / (2 * sigma ** 2))
    else:
        axis = (torch.floor(pixels / stride)[None] == torch.arange(cells)[:, None]).double()
    kernel = torch.einsum("ap,bq->abpq", axis, axis).reshape(cells * cells, size * size)
    return (kernel / kernel.sum(1, keepdim=True)).float()


def concept_relevance_maps(relevance: torch.Tensor, size: int, sigma: float) -> torch.Tensor:
    """Conservative upsampling of (B, D, h, w) cell relevances to (B, D, size, size) pixel relevances."""
    b, d, h, w = relevance.shape
    require(h == w, "feature maps must be square")
    kernel = receptive_field_kernel(h, size, sigma)
    return (relevance.reshape(b, d, h * w) @ kernel).reshape(b, d, size, size)


@dataclass
class CaveModel:
    backbone: Backbone
    concepts: torch.Tensor  # (M, d) class concepts then clutter concepts
    concept_class: torch.Tensor  # (M,) class of each concept, -1 for clutter
    bank: torch.Tensor  # (C*K, d) vertex features
    n_classes: int
    classifier: str
    explain_temperature: float = 0.07
    relevance_sigma_px: float = 7.0
    explanation: str = "lrp"
    lrp_top_rule: str = "epsilon"

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        self.backbone.eval()
        return F.normalize(self.backbone(images), dim=1)

    @torch.no_grad()
    def predict(self, images: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
        out = [concept_scores(self.features(images[i:i + batch_size]), self.concepts, self.concept_class,
                              self.n_classes, self.classifier)[0].argmax(1) for i in range(0, len(images), batch_size)]
        return torch.cat(out)

    @torch.no_grad()
    def explain(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
        """Pixel relevance maps of the concepts of each image's (given) class: (N, D, S, S)."""
        if self.explanation == "lrp":
            return self.explain_lrp(images, labels)
        require(self.explanation == "gaussian", f"unknown explanation {self.explanation!r}")
        out = []
        for i in range(0, len(images), batch_size):
            cos = torch.einsum("bdhw,md->bmhw", self.features(images[i:i + batch_size]), self.concepts)
            relevance = concept_relevance(cos, self.concept_class, labels[i:i + batch_size], self.classifier,
                                          self.explain_temperature)
            out.append(concept_relevance_maps(relevance, images.shape[-1], self.relevance_sigma_px))
        return torch.cat(out)


    @torch.no_grad()
    def explain_lrp(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 16,
                    eps: float = 1e-6) -> torch.Tensor:
        """The paper's explanation: concept relevances R(i, h) at the matching layer (`concept_relevance`), shared
        over the feature channels by the NOV-aware rule (`lrp.nov_feature_relevance`), then LRP layer by layer
        through the backbone (zbox at the pixels, zplus in between, `lrp_top_rule` on the last conv). Pixel maps
        (N, D, S, S) summed over colour channels; each sums to its concept's relevance (conservation)."""
        from toolkit.explain import lrp

        self.backbone.eval()
        layers = lrp.fold_sequential(self.backbone.net)
        rules = lrp.default_rules(len(layers), self.lrp_top_rule)
        ids = torch.stack([torch.nonzero(self.concept_class == c)[:, 0] for c in range(self.n_classes)])
        out = []
        for i in range(0, len(images), batch_size):
            x, y = images[i:i + batch_size], labels[i:i + batch_size]
            inputs, z = lrp.forward_inputs(layers, x)
            features = F.normalize(z, dim=1)
            cos = torch.einsum("bdhw,md->bmhw", features, self.concepts)
            relevance = concept_relevance(cos, self.concept_class, y, self.classifier, self.explain_temperature)
            r_z = lrp.nov_feature_relevance(features, self.concepts[ids[y]], relevance, eps)
            out.append(lrp.lrp_backward(layers, inputs, r_z, rules, eps).sum(2))
        return torch.cat(out)


def as_tensor_images(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images.astype(np.float32) / 255.0)


def volume_projections(data, index, volumes) -> tuple[np.ndarray, np.ndarray]:
    """Projected vertices and visibility per image; datasets from real photos carry per-image `fovs` and `rolls`."""
    fovs, rolls = data.get("fovs", np.full(len(data["labels"]), 40.0)), data.get("rolls", np.zeros(len(data["labels"])))
    coords, visible = zip(*(visible_projection(*volumes[data["labels"][i]], data["poses"][i], data["scales"][i],
                                               data["pix_to_face"][i], fovs[i], rolls[i]) for i in index))
    return np.stack(coords).astype(np.float32), np.stack(visible)


def background_cells(pix_to_face: np.ndarray, stride: int) -> torch.Tensor:
    """(N, h, w) feature cells whose stride x stride pixels are all background."""
    n, size, _ = pix_to_face.shape
    cells = (pix_to_face == NO_FACE).reshape(n, size // stride, stride, size // stride, stride)
    return torch.from_numpy(cells.all(axis=(2, 4)))


# long: one training loop (the feature extractor, the neural mesh features, the contrastive loss and its
# optimiser share state across epochs); read top to bottom as the paper's training recipe
def train_cave(config: CaveConfig, data: dict, ctx) -> tuple[CaveModel, dict]:
    n_classes = len(data["classes"])
    train = np.nonzero(data["split"] == "train")[0]
    require(len(train) > 0, "the dataset has no train split")
    for c in range(n_classes):
        require((data["labels"][train] == c).any(), f"class {data['classes'][c]} has no training images")
    size = data["images"].shape[-1]
    require(size % 4 == 0, f"image size {size} must be a multiple of 4 (backbone stride)")
    generator = torch.Generator().manual_seed(ctx.seed)
    volumes = [ellipsoid_volume(data[f"mesh{c}_vertices"], config.n_vertices) for c in range(n_classes)]
    coords_np, visible_np = volume_projections(data, train, volumes)
    images, labels = as_tensor_images(data["images"][train]), torch.from_numpy(data["labels"][train])
    coords, visible = torch.from_numpy(coords_np), torch.from_numpy(visible_np)
    background = background_cells(data["pix_to_face"][train], 4)
    backbone = Backbone(config.feature_dim, config.width)
    optimiser = torch.optim.Adam(backbone.parameters(), lr=config.lr)
    k = config.n_vertices
    bank = F.normalize(torch.randn(n_classes * k, config.feature_dim, generator=generator), dim=-1)
    clutter = F.normalize(torch.randn(config.clutter_queue, config.feature_dim, generator=generator), dim=-1)
    queue_at, history = 0, []
    for _ in ctx.progress(range(config.epochs), total=config.epochs, description="CAVE (NOVUM training)"):
        backbone.train()
        order = torch.randperm(len(train), generator=generator)
        epoch_loss = 0.0
        for batch in order.split(config.batch_size):
            features = F.normalize(backbone(images[batch]), dim=1)
            vertex_features = sample_features(features, coords[batch], size)
            loss = nov_contrastive_loss(vertex_features, visible[batch], labels[batch], coords[batch], bank,
                                        clutter, config.temperature, config.neighbour_px)
            cells = features.permute(0, 2, 3, 1)[background[batch]]
            picked = cells[torch.randperm(len(cells), generator=generator)[:config.clutter_per_image * len(batch)]]
            if len(picked):
                loss = loss + clutter_loss(picked, bank, clutter, config.temperature)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            epoch_loss += loss.item() * len(batch)
            with torch.no_grad():
                momentum_update(bank, vertex_features.detach(), visible[batch], labels[batch], config.bank_momentum)
                slots = (queue_at + torch.arange(len(picked))) % len(clutter)
                clutter[slots] = picked.detach()
                queue_at = int(queue_at + len(picked)) % len(clutter)
        history.append(epoch_loss / len(train))
        log.info("CAVE epoch %d: loss %.4f", len(history), history[-1])
    concepts, concept_class = [], []
    for c in range(n_classes):
        members = data["labels"][train] == c
        kept = visible_np[members].mean(0) > config.visibility_threshold
        require(kept.any(), f"no vertex of class {data['classes'][c]} is visible in enough training images")
        centres = kmeans_concepts(bank[c * k:(c + 1) * k][torch.from_numpy(kept)].numpy(),
                                  config.concepts_per_class, ctx.seed)
        require(len(centres) == config.concepts_per_class, f"class {c}: fewer visible vertices than concepts")
        concepts.append(centres)
        concept_class += [c] * len(centres)
    if config.background_concepts:
        concepts.append(kmeans_concepts(clutter.numpy(), config.background_concepts, ctx.seed))
        concept_class += [-1] * config.background_concepts
    model = CaveModel(backbone, torch.from_numpy(np.concatenate(concepts)).float(), torch.tensor(concept_class),
                      bank, n_classes, config.classifier, config.explain_temperature, config.relevance_sigma_px,
                      config.explanation, config.lrp_top_rule)
    return model, {"loss_first_epoch": history[0], "loss_last_epoch": history[-1],
                   "visible_vertices_per_image": float(visible_np.sum(1).mean())}


# ---- run ------------------------------------------------------------------------------------------------------

def split_accuracy(predict, data) -> dict[str, float]:
    out = {}
    ood_cv = sorted(str(split) for split in set(data["split"]) if str(split).startswith("ood_"))
    for split in ("test", "occlusion", "texture", "noise", "unseen_pose", *ood_cv):
        index = np.nonzero(data["split"] == split)[0]
        if len(index):
            predicted = predict(as_tensor_images(data["images"][index])).numpy()
            out["acc_iid" if split == "test" else f"acc_{split}"] = float((predicted == data["labels"][index]).mean())
    return out


def method_slug(method: str) -> str:
    """A file-name form of a method name: 'CAVE' -> 'cave', '2D CNN + Grad-CAM' -> '2d_cnn_grad_cam'."""
    return "_".join("".join(ch if ch.isalnum() else " " for ch in method.lower()).split())
