"""CAVE's neural object volumes (NOV): ellipsoid volumes, their visible projection into an image, features sampled
at the projected vertices, and the NOV contrastive / clutter losses with the momentum feature bank."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from toolkit.explain.render3d import NO_FACE, look_at_camera, project


def ellipsoid_volume(mesh_vertices: np.ndarray, n_vertices: int) -> tuple[np.ndarray, np.ndarray]:
    """Points (K, 3) of a Fibonacci lattice on the ellipsoid through the mesh's bounding-box half extents, and
    their outward unit normals."""
    low, high = mesh_vertices.min(0), mesh_vertices.max(0)
    centre, axes = (low + high) / 2, (high - low) / 2
    k = np.arange(n_vertices) + 0.5
    polar = np.arccos(1 - 2 * k / n_vertices)
    azimuth = np.pi * (1 + 5 ** 0.5) * k
    sphere = np.stack([np.cos(azimuth) * np.sin(polar), np.cos(polar), np.sin(azimuth) * np.sin(polar)], -1)
    normals = sphere / axes
    return centre + sphere * axes, normals / np.linalg.norm(normals, axis=1, keepdims=True)


def visible_projection(points: np.ndarray, normals: np.ndarray, pose: np.ndarray, scale: np.ndarray,
                       pix_to_face: np.ndarray, fov_deg: float = 40.0,
                       roll_deg: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates (K, 2) of the deformed volume's vertices and which are visible: facing the camera
    (exact self-occlusion for a convex volume), inside the image and landing on the object's rendered pixels."""
    size = pix_to_face.shape[0]
    camera = look_at_camera(*pose, size=size, fov_deg=fov_deg, roll_deg=roll_deg)
    world = points * scale
    world_normals = normals / scale
    coords, depth = project(camera, world)
    facing = ((camera.eye - world) * world_normals).sum(1) > 0
    pixel = np.floor(coords).astype(np.int64)
    inside = (pixel >= 0).all(1) & (pixel < size).all(1) & (depth > 0)
    clipped = np.clip(pixel, 0, size - 1)
    on_object = pix_to_face[clipped[:, 1], clipped[:, 0]] != NO_FACE
    return coords, facing & inside & on_object


def sample_features(features: torch.Tensor, coords: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear feature at image pixel coordinates: features (B, d, h, w), coords (B, K, 2) -> (B, K, d)."""
    grid = (coords / size * 2 - 1)[:, :, None, :]
    return F.grid_sample(features, grid, align_corners=False)[..., 0].transpose(1, 2)


def nov_contrastive_loss(vertex_features, visible, labels, coords, bank, clutter, temperature, neighbour_px):
    """NOVUM's vertex loss: cross-entropy of each visible vertex's pixel feature (B, K, d) over all volume
    features (C*K, d) + clutter (Q, d), the target being its own vertex, same-volume neighbours masked."""
    batch, k, _ = vertex_features.shape
    n_classes = bank.shape[0] // k
    logits = torch.cat([vertex_features @ bank.T, vertex_features @ clutter.T], dim=-1) / temperature
    near = torch.cdist(coords, coords) < neighbour_px
    near &= ~torch.eye(k, dtype=torch.bool)[None]
    masked = torch.zeros(batch, k, n_classes, k, dtype=torch.bool)
    masked[torch.arange(batch), :, labels] = near  # only the own volume's neighbours
    masked = torch.cat([masked.reshape(batch, k, -1), torch.zeros(batch, k, len(clutter), dtype=torch.bool)], -1)
    logits = logits.masked_fill(masked, float("-inf"))
    target = labels[:, None] * k + torch.arange(k)[None]
    losses = F.cross_entropy(logits.reshape(batch * k, -1), target.reshape(-1), reduction="none")
    return losses[visible.reshape(-1)].mean()


def clutter_loss(background_features, bank, clutter, temperature):
    """Background pixel features should match the clutter queue rather than any volume: -log P(clutter)."""
    logits = torch.cat([background_features @ bank.T, background_features @ clutter.T], dim=-1) / temperature
    return (logits.logsumexp(-1) - logits[:, bank.shape[0]:].logsumexp(-1)).mean()


def momentum_update(bank, vertex_features, visible, labels, momentum):
    """bank[v] <- normalise(m * bank[v] + (1 - m) * mean of this batch's features of v), visible vertices only."""
    k = vertex_features.shape[1]
    index = (labels[:, None] * k + torch.arange(k)[None])[visible]
    sums = torch.zeros_like(bank).index_add_(0, index, vertex_features[visible])
    counts = torch.zeros(len(bank)).index_add_(0, index, torch.ones(len(index)))
    seen = counts > 0
    bank[seen] = F.normalize(momentum * bank[seen] + (1 - momentum) * sums[seen] / counts[seen, None], dim=-1)
