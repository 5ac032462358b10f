"""CPU rendering for CAVE: part-coloured meshes composed from open3d primitives, a pinhole camera, ray casting
with open3d's RaycastingScene (pix_to_face, the exact analogue of pytorch3d's rasterizer with faces_per_pixel=1)
and a brute-force numpy ray-triangle reference the tests compare it with.

Coordinates: world y is up; a pose is (azimuth, elevation, distance) of a camera looking at the origin.
A pixel (row i, col j) has its centre at (j + 0.5, i + 0.5) in image coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NO_FACE = -1  # pix_to_face value of background pixels


@dataclass(frozen=True)
class PartMesh:
    """A triangle mesh whose faces belong to named parts (the unit that carries a colour)."""

    vertices: np.ndarray  # (V, 3) float64
    triangles: np.ndarray  # (F, 3) int64
    face_part: np.ndarray  # (F,) int64 index into parts
    parts: tuple[str, ...]

    def scaled(self, scale: np.ndarray) -> "PartMesh":
        """The same topology (face ids keep their meaning) with every vertex scaled per axis."""
        return PartMesh(self.vertices * np.asarray(scale)[None, :], self.triangles, self.face_part, self.parts)


@dataclass(frozen=True)
class Camera:
    eye: np.ndarray  # (3,) camera centre
    forward: np.ndarray  # (3,) unit viewing direction
    right: np.ndarray  # (3,) unit, image +column direction
    up: np.ndarray  # (3,) unit, image -row direction
    focal: float  # pixels
    size: int  # square image side in pixels


def look_at_camera(azimuth_deg: float, elevation_deg: float, distance: float, size: int,
                   fov_deg: float = 40.0, roll_deg: float = 0.0) -> Camera:
    """A camera on the sphere of radius `distance` (y up) looking at the origin; roll_deg turns the image plane
    counter-clockwise about the viewing axis (PASCAL3D+'s in-plane rotation theta)."""
    a, e = np.radians(azimuth_deg), np.radians(elevation_deg)
    eye = distance * np.array([np.cos(e) * np.sin(a), np.sin(e), np.cos(e) * np.cos(a)])
    forward = -eye / np.linalg.norm(eye)
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    roll = np.radians(roll_deg)
    right, up = np.cos(roll) * right - np.sin(roll) * up, np.sin(roll) * right + np.cos(roll) * up
    focal = (size / 2) / np.tan(np.radians(fov_deg) / 2)
    return Camera(eye, forward, right, up, float(focal), size)


def camera_rays(camera: Camera) -> np.ndarray:
    """(size, size, 6) rays (origin, unit direction) through every pixel centre."""
    centre = np.arange(camera.size) + 0.5 - camera.size / 2
    cols, rows = np.meshgrid(centre, centre)
    directions = (camera.focal * camera.forward[None, None, :] + cols[..., None] * camera.right
                  - rows[..., None] * camera.up)
    directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
    origins = np.broadcast_to(camera.eye, directions.shape)
    return np.concatenate([origins, directions], axis=-1)


def project(camera: Camera, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Image coordinates (N, 2) as (x=col, y=row) in pixel units (pixel centres at k + 0.5) and depths (N,)."""
    offset = points - camera.eye
    depth = offset @ camera.forward
    x = camera.focal * (offset @ camera.right) / depth + camera.size / 2
    y = -camera.focal * (offset @ camera.up) / depth + camera.size / 2
    return np.stack([x, y], axis=-1), depth


def raycast(mesh: PartMesh, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """open3d ray casting: (face id per ray with NO_FACE for misses, unit face normal per ray)."""
    import open3d as o3d

    scene = o3d.t.geometry.RaycastingScene()
    scene.add_triangles(o3d.core.Tensor(mesh.vertices.astype(np.float32)),
                        o3d.core.Tensor(mesh.triangles.astype(np.uint32)))
    hits = scene.cast_rays(o3d.core.Tensor(rays.astype(np.float32)))
    ids = hits["primitive_ids"].numpy().astype(np.int64)
    ids[ids == scene.INVALID_ID] = NO_FACE
    return ids, hits["primitive_normals"].numpy().astype(np.float64)


def raycast_reference(vertices: np.ndarray, triangles: np.ndarray, rays: np.ndarray) -> np.ndarray:
    """Nearest hit face per ray by testing every ray against every triangle (Moller-Trumbore); NO_FACE on a miss."""
    flat = rays.reshape(-1, 6)
    origin, direction = flat[:, None, :3], flat[:, None, 3:]
    a, b, c = (vertices[triangles[:, k]][None] for k in range(3))
    edge1, edge2 = b - a, c - a
    p = np.cross(direction, edge2)
    det = np.einsum("rfk,rfk->rf", edge1, p)
    safe = np.where(np.abs(det) < 1e-12, np.nan, det)
    s = origin - a
    u = np.einsum("rfk,rfk->rf", s, p) / safe
    q = np.cross(s, edge1)
    v = np.einsum("rfk,rfk->rf", direction, q) / safe
    t = np.einsum("rfk,rfk->rf", edge2, q) / safe
    hit = (u >= 0) & (v >= 0) & (u + v <= 1) & (t > 1e-9)
    t = np.where(hit, t, np.inf)
    nearest = t.argmin(axis=1)
    return np.where(np.isfinite(t.min(axis=1)), nearest, NO_FACE).reshape(rays.shape[:-1])


# ---- meshes -----------------------------------------------------------------------------------------------------

def _part(legacy, subdivisions: int, rotate_xyz=(0.0, 0.0, 0.0), translate=(0.0, 0.0, 0.0)):
    import open3d as o3d

    if subdivisions:
        legacy = legacy.subdivide_midpoint(subdivisions)
    rotation = o3d.geometry.get_rotation_matrix_from_xyz(np.radians(rotate_xyz))
    legacy.rotate(rotation, center=(0, 0, 0))
    legacy.translate(translate)
    return np.asarray(legacy.vertices), np.asarray(legacy.triangles)


def _box(w, h, d, centre, subdivisions=1):
    import open3d as o3d

    box = o3d.geometry.TriangleMesh.create_box(w, h, d)
    box.translate((-w / 2, -h / 2, -d / 2))
    return _part(box, subdivisions, translate=centre)


def _cylinder(radius, length, centre, rotate_xyz, subdivisions=0):
    import open3d as o3d

    return _part(o3d.geometry.TriangleMesh.create_cylinder(radius, length, resolution=12, split=1), subdivisions,
                 rotate_xyz, centre)


def _merge(parts: dict[str, tuple[np.ndarray, np.ndarray]]) -> PartMesh:
    vertices, triangles, face_part, offset = [], [], [], 0
    for index, (v, t) in enumerate(parts.values()):
        vertices.append(v)
        triangles.append(t + offset)
        face_part.append(np.full(len(t), index))
        offset += len(v)
    return PartMesh(np.concatenate(vertices), np.concatenate(triangles).astype(np.int64),
                    np.concatenate(face_part).astype(np.int64), tuple(parts))


def _car() -> PartMesh:
    return _merge({
        "body": _box(2.0, 0.55, 1.0, (0.0, -0.05, 0.0)),
        "cabin": _box(0.9, 0.45, 0.85, (-0.35, 0.45, 0.0)),
        "wheels": _cylinder(0.28, 1.12, (0.6, -0.35, 0.0), (0, 0, 0)),
        "rear_wheels": _cylinder(0.28, 1.12, (-0.6, -0.35, 0.0), (0, 0, 0)),
        "lights": _box(0.08, 0.18, 0.7, (1.03, 0.05, 0.0), 0),
    })


def _house() -> PartMesh:
    import open3d as o3d

    roof = o3d.geometry.TriangleMesh.create_cone(radius=1.05, height=0.8, resolution=4, split=2)
    return _merge({
        "walls": _box(1.4, 1.0, 1.4, (0.0, -0.3, 0.0)),
        "roof": _part(roof, 1, (-90.0, 45.0, 0.0), (0.0, 0.2, 0.0)),
        "chimney": _box(0.22, 0.6, 0.22, (0.4, 0.6, 0.35), 0),
        "door": _box(0.35, 0.6, 0.06, (-0.3, -0.5, 0.72), 0),
    })


def _mug() -> PartMesh:
    import open3d as o3d

    handle = o3d.geometry.TriangleMesh.create_torus(0.32, 0.08, radial_resolution=10, tubular_resolution=6)
    return _merge({
        "cup": _cylinder(0.55, 1.3, (0.0, 0.0, 0.0), (90.0, 0, 0)),
        "handle": _part(handle, 0, (0.0, 0.0, 0.0), (0.62, 0.0, 0.0)),
        "logo": _box(0.06, 0.45, 0.4, (-0.56, 0.1, 0.0), 0),
    })


def _plane() -> PartMesh:
    import open3d as o3d

    nose = o3d.geometry.TriangleMesh.create_cone(radius=0.22, height=0.45, resolution=12, split=1)
    return _merge({
        "fuselage": _cylinder(0.22, 2.0, (0.0, 0.0, 0.0), (0.0, 90.0, 0.0)),
        "wings": _box(0.55, 0.06, 2.2, (0.15, 0.0, 0.0)),
        "tail": _box(0.35, 0.55, 0.06, (-0.85, 0.35, 0.0), 0),
        "nose": _part(nose, 0, (0.0, 90.0, 0.0), (1.0, 0.0, 0.0)),
    })


CLASS_MESHES = {"car": _car, "house": _house, "mug": _mug, "plane": _plane}
# one RGB colour per part, in the order each builder lists its parts; the texture-swap split recolours them
PALETTES = {
    "car": [(0.85, 0.15, 0.15), (0.55, 0.8, 0.95), (0.15, 0.15, 0.15), (0.15, 0.15, 0.15), (0.95, 0.9, 0.2)],
    "house": [(0.9, 0.8, 0.6), (0.6, 0.2, 0.1), (0.5, 0.5, 0.5), (0.1, 0.5, 0.2)],
    "mug": [(0.2, 0.35, 0.85), (0.95, 0.55, 0.1), (0.95, 0.95, 0.95)],
    "plane": [(0.8, 0.8, 0.85), (0.2, 0.3, 0.7), (0.8, 0.1, 0.1), (0.1, 0.1, 0.1)],
}


def class_mesh(name: str) -> PartMesh:
    return CLASS_MESHES[name]()


def shade(mesh_colours: np.ndarray, face_ids: np.ndarray, normals: np.ndarray, light: np.ndarray,
          background: np.ndarray, ambient: float = 0.35) -> np.ndarray:
    """Lambert shading (two-sided) of per-face colours; background where no face was hit. Returns (H, W, 3)."""
    hit = face_ids != NO_FACE
    lambert = np.abs(normals @ light)
    colour = mesh_colours[np.where(hit, face_ids, 0)] * (ambient + (1 - ambient) * lambert)[..., None]
    return np.where(hit[..., None], colour, background)
