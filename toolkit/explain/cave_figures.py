"""PNG figures for `explain cave`: concept maps over test images, and each concept's mean face distribution
(Omega, normalised per image then averaged) painted on the class mesh."""

from __future__ import annotations

import logging

import numpy as np

from toolkit.explain.cave import method_slug
from toolkit.explain.consistency import project_to_faces
from toolkit.explain.render3d import NO_FACE, PartMesh, camera_rays, look_at_camera, raycast

log = logging.getLogger("iclrkit")
MESH_VIEWS = ((30.0, 25.0), (210.0, 25.0))  # azimuth, elevation of the two mesh renders


def _winner_image(maps: np.ndarray) -> np.ndarray:
    """Colour each pixel by its strongest concept (dark where no concept fires): (S, S, 3)."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"](np.arange(maps.shape[0]) % 10)[:, :3]
    strength = maps.max(0)
    return colours[maps.argmax(0)] * (strength / max(strength.max(), 1e-12))[..., None]


def image_figure(path, data, test, maps_by_method, per_class: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = [i for c in range(len(data["classes"])) for i in np.nonzero(data["labels"][test] == c)[0][:per_class]]
    methods = list(maps_by_method)
    fig, axes = plt.subplots(len(picks), 1 + len(methods), figsize=(2 * (1 + len(methods)), 2 * len(picks)),
                             squeeze=False)
    for row, i in enumerate(picks):
        axes[row, 0].imshow(data["images"][test[i]].transpose(1, 2, 0))
        for col, method in enumerate(methods, start=1):
            axes[row, col].imshow(_winner_image(maps_by_method[method][i]))
            if row == 0:
                axes[row, col].set_title(method, fontsize=7)
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def mean_face_distribution(maps: np.ndarray, pix_to_face: np.ndarray, n_faces: int) -> np.ndarray:
    omegas = np.stack([project_to_faces(m, p, n_faces) for m, p in zip(maps, pix_to_face)])
    mass = omegas.sum(1, keepdims=True)
    return (omegas / np.where(mass > 0, mass, 1)).mean(0)


def mesh_figure(path, data, test, maps: np.ndarray, size: int = 96, max_concepts: int = 8) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_classes, n_concepts = len(data["classes"]), min(maps.shape[1], max_concepts)
    fig, axes = plt.subplots(n_classes, n_concepts * len(MESH_VIEWS), squeeze=False,
                             figsize=(1.2 * n_concepts * len(MESH_VIEWS), 1.3 * n_classes))
    for c in range(n_classes):
        members = np.nonzero(data["labels"][test] == c)[0]
        vertices, triangles = data[f"mesh{c}_vertices"], data[f"mesh{c}_triangles"]
        mesh = PartMesh(vertices, triangles, np.zeros(len(triangles), np.int64), ("object",))
        views = [raycast(mesh, camera_rays(look_at_camera(a, e, 4.5, size)))[0] for a, e in MESH_VIEWS]
        for j in range(n_concepts):
            weights = mean_face_distribution(maps[members, j], data["pix_to_face"][test[members]], len(triangles))
            weights = weights / max(weights.max(), 1e-12)
            for v, faces in enumerate(views):
                colour = matplotlib.colormaps["viridis"](weights[np.where(faces != NO_FACE, faces, 0)])[..., :3]
                ax = axes[c, j * len(MESH_VIEWS) + v]
                ax.imshow(np.where((faces != NO_FACE)[..., None], colour, 1.0))
                ax.axis("off")
                if c == 0 and v == 0:
                    ax.set_title(f"concept {j}", fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def concept_figures(ctx, data, test, maps_by_method: dict[str, np.ndarray]) -> None:
    image_figure(ctx.path("concept_maps.png"), data, test, maps_by_method)
    try:
        import open3d  # noqa: F401  (the mesh renders ray cast with open3d)
    except ImportError:
        log.warning("open3d is not installed: concepts_on_mesh.png skipped (pip install open3d-cpu)")
        return
    for method, maps in maps_by_method.items():
        mesh_figure(ctx.path(f"concepts_on_mesh_{method_slug(method)}.png"), data, test, maps)
