"""Ray casting (open3d) against a direct ray-triangle computation; camera projection; synthetic data set."""

import numpy as np
import pytest

from toolkit.explain.render3d import camera_rays, look_at_camera, project, raycast_reference


def test_projection_of_points_on_pixel_rays_lands_on_the_pixel_centres():
    camera = look_at_camera(37.0, 21.0, 5.0, 12)
    rays = camera_rays(camera).reshape(-1, 6)
    points = rays[:, :3] + rays[:, 3:] * np.linspace(2, 7, len(rays))[:, None]
    coords, depth = project(camera, points)
    rows, cols = np.divmod(np.arange(len(rays)), 12)
    np.testing.assert_allclose(coords, np.stack([cols + 0.5, rows + 0.5], 1), atol=1e-9)
    assert (depth > 0).all()


def test_reference_raycaster_picks_the_nearest_of_two_stacked_triangles():
    vertices = np.array([[-1, -1, 0], [1, -1, 0], [0, 1, 0], [-1, -1, 1], [1, -1, 1], [0, 1, 1.0]])
    triangles = np.array([[0, 1, 2], [3, 4, 5]])
    rays = np.array([[0, 0, 5, 0, 0, -1], [0, 0, -5, 0, 0, 1], [3, 3, 5, 0, 0, -1.0]])
    np.testing.assert_array_equal(raycast_reference(vertices, triangles, rays), [1, 0, -1])


@pytest.mark.parametrize("name", ["car", "house", "mug", "plane"])
def test_open3d_pix_to_face_agrees_with_direct_ray_triangle_intersection(name):
    pytest.importorskip("open3d")
    from toolkit.explain.render3d import class_mesh, raycast

    mesh = class_mesh(name).scaled(np.array([1.1, 0.9, 1.05]))
    for azimuth, elevation in ((20.0, 15.0), (200.0, 35.0)):
        rays = camera_rays(look_at_camera(azimuth, elevation, 4.6, 20))
        faces, normals = raycast(mesh, rays)
        reference = raycast_reference(mesh.vertices, mesh.triangles, rays)
        assert (faces >= 0).mean() > 0.1  # the object is in view
        agree = (faces == reference).mean()
        assert agree >= 0.99, f"{name}: open3d and the reference agree on {agree:.3f} of the pixels"
        hit = faces >= 0
        np.testing.assert_allclose(np.linalg.norm(normals[hit], axis=-1), 1.0, atol=1e-4)


def test_synthetic_dataset_round_trips_and_keeps_face_ids_per_class(tmp_path):
    pytest.importorskip("open3d")
    from toolkit.explain.cave_data import SPLITS, SyntheticSpec, build_synthetic, load_dataset, save_dataset

    data = build_synthetic(SyntheticSpec(n_classes=2, n_train_per_class=2, n_test_per_class=1, image_size=32), 0)
    save_dataset(data, tmp_path / "d.npz")
    loaded = load_dataset(tmp_path / "d.npz")
    assert sorted(set(loaded["split"].tolist())) == sorted(SPLITS)
    test = loaded["split"] == "test"
    occluded = loaded["split"] == "occlusion"
    # the occlusion split hides object pixels of the same render: fewer faces visible, none added
    assert ((loaded["pix_to_face"][occluded] >= 0).sum() < (loaded["pix_to_face"][test] >= 0).sum())
    assert ((loaded["pix_to_face"][occluded] >= 0) <= (loaded["pix_to_face"][test] >= 0)).all()
    np.testing.assert_array_equal(loaded["poses"][test], loaded["poses"][loaded["split"] == "texture"])


def test_load_dataset_rejects_missing_keys_and_bad_labels(tmp_path):
    from toolkit.core.errors import BadInputError
    from toolkit.explain.cave_data import load_dataset

    np.savez(tmp_path / "bad.npz", images=np.zeros((1, 3, 4, 4), np.uint8))
    with pytest.raises(BadInputError, match="lacks"):
        load_dataset(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(BadInputError, match="cannot read"):
        load_dataset(tmp_path / "junk.npz")
