"""The PASCAL3D+ release1.1 reader (toolkit/explain/cave_pascal3d.py) on a tiny fake directory, checked against
PASCAL3D+'s own projection written out here (camera centre, Rx(-(pi/2 - e)) Rz(-a), viewport, theta, y flip)."""

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

from toolkit.core.errors import BadInputError
from toolkit.explain.cave import visible_projection
from toolkit.explain.cave_data import load_dataset, save_dataset
from toolkit.explain.cave_pascal3d import Pascal3DSpec, load_pascal3d
from toolkit.explain.render3d import NO_FACE, look_at_camera, project

pytestmark = pytest.mark.usefixtures("one_thread")

# a box, z-up like PASCAL3D+ CAD models, 1-based faces
CORNERS = np.array([[x, y, z] for x in (-1.0, 1.2) for y in (-0.5, 0.6) for z in (-0.3, 0.4)])
QUADS = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]
FACES = np.array([tri for a, b, c, d in QUADS for tri in ((a, b, c), (a, c, d))]) + 1
VIEW = {"azimuth": 30.0, "elevation": 20.0, "distance": 6.0, "focal": 1.0, "px": 70.0, "py": 55.0,
        "theta": 12.0, "viewport": 600.0}
BOX = [40.0, 30.0, 105.0, 80.0]


def pascal3d_project(points, view):
    a, e, d = np.radians(view["azimuth"]), np.radians(view["elevation"]), view["distance"]
    centre = d * np.array([np.cos(e) * np.sin(a), -np.cos(e) * np.cos(a), np.sin(e)])
    a, e = -a, -(np.pi / 2 - e)
    rz = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(e), -np.sin(e)], [0, np.sin(e), np.cos(e)]])
    camera = (points - centre) @ (rx @ rz).T
    m = view["viewport"] * view["focal"]
    x, y = m * camera[:, 0] / -camera[:, 2], m * camera[:, 1] / -camera[:, 2]
    t = np.radians(view["theta"])
    x, y = np.cos(t) * x - np.sin(t) * y, np.sin(t) * x + np.cos(t) * y
    return np.stack([x + view["px"], -y + view["py"]], axis=1)


@pytest.fixture()
def pascal_root(tmp_path):
    root = tmp_path / "PASCAL3D+"
    for name in ("car",):
        (root / "CAD").mkdir(parents=True)
        models = np.zeros((2,), dtype=[("vertices", object), ("faces", object)])
        models[0] = (CORNERS, FACES)
        models[1] = (CORNERS * 2, FACES)
        savemat(root / "CAD" / f"{name}.mat", {name: models})
        for folder in ("Images", "Annotations"):
            (root / folder / f"{name}_imagenet").mkdir(parents=True)
        (root / "Image_sets").mkdir(parents=True)
        (root / "Image_sets" / f"{name}_imagenet_train.txt").write_text("n001\nn002\n")
        (root / "Image_sets" / f"{name}_imagenet_val.txt").write_text("n003\n")
        for image_name in ("n001", "n002", "n003"):
            write_image_and_record(root / "Images" / f"{name}_imagenet", root / "Annotations" / f"{name}_imagenet",
                                   image_name, name, VIEW)
    return root


def write_image_and_record(image_dir, annotation_dir, image_name, name, view):
    image_dir.mkdir(parents=True, exist_ok=True)
    annotation_dir.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(0).integers(0, 255, (110, 140, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(image_dir / f"{image_name}.JPEG")
    objects = np.zeros((2,), dtype=[("class", object), ("bbox", object), ("viewpoint", object)])
    objects[0] = ("person", [0.0, 0.0, 10.0, 10.0], {**view})  # other class: skipped
    objects[1] = (name, BOX, dict(view))
    savemat(annotation_dir / f"{image_name}.mat", {"record": {"filename": f"{image_name}.JPEG", "objects": objects}})


OOD_VIEW = {**VIEW, "azimuth": 200.0, "elevation": 65.0}


@pytest.fixture()
def ood_root(tmp_path):
    """OOD-CV pose-release layout: lists/<cls>_<nuisance>.txt, images/<cls>/, annotations/<cls>/."""
    root = tmp_path / "OOD-CV"
    (root / "lists").mkdir(parents=True)
    (root / "lists" / "car_pose.txt").write_text("o101 1\no102 1\n")
    for image_name in ("o101", "o102"):
        write_image_and_record(root / "images" / "car", root / "annotations" / "car", image_name, "car", OOD_VIEW)
    return root


def test_reader_matches_pascal3d_projection_and_the_dataset_format(pascal_root, tmp_path):
    data = load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("car",), image_size=32))
    assert list(data["split"]) == ["train", "train", "test"]
    assert data["images"].shape == (3, 3, 32, 32) and data["pix_to_face"].shape == (3, 32, 32)
    np.testing.assert_allclose(data["mesh0_triangles"], FACES - 1)
    # PASCAL3D+'s projection of the CAD corners, mapped into the crop, equals our camera's projection
    side = 2 * 1.2 * max(abs(BOX[0] - VIEW["px"]), abs(BOX[2] - VIEW["px"]), abs(BOX[1] - VIEW["py"]),
                         abs(BOX[3] - VIEW["py"]))
    expected = (pascal3d_project(CORNERS, VIEW) - [VIEW["px"] - side / 2, VIEW["py"] - side / 2]) * 32 / side
    camera = look_at_camera(*data["poses"][0], size=32, fov_deg=data["fovs"][0], roll_deg=data["rolls"][0])
    ours, depth = project(camera, data["mesh0_vertices"])
    np.testing.assert_allclose(ours, expected, atol=1e-6)
    assert (depth > 0).all()
    # pix_to_face lies inside the convex hull of the projected corners and covers the object
    on_object = data["pix_to_face"][0] != NO_FACE
    rows, cols = np.nonzero(on_object)
    assert on_object.sum() > 20
    assert cols.min() + 0.5 >= expected[:, 0].min() - 1e-6 and cols.max() + 0.5 <= expected[:, 0].max() + 1e-6
    assert rows.min() + 0.5 >= expected[:, 1].min() - 1e-6 and rows.max() + 0.5 <= expected[:, 1].max() + 1e-6
    path = tmp_path / "p3d.npz"
    save_dataset(data, path)
    loaded = load_dataset(path)
    assert set(loaded) == set(data)
    from toolkit.explain.cave import ellipsoid_volume

    points, normals = ellipsoid_volume(loaded["mesh0_vertices"], 30)
    _, visible = visible_projection(points, normals, loaded["poses"][0], loaded["scales"][0],
                                    loaded["pix_to_face"][0], loaded["fovs"][0], loaded["rolls"][0])
    assert visible.any()


def test_ood_cv_nuisances_become_ood_splits_with_their_own_poses(pascal_root, ood_root):
    data = load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("car",), image_size=32,
                                      ood_cv_root=str(ood_root), nuisances=("pose",)))
    assert list(data["split"]) == ["train", "train", "test", "ood_pose", "ood_pose"]
    np.testing.assert_allclose(data["poses"][3], [OOD_VIEW["azimuth"], OOD_VIEW["elevation"], OOD_VIEW["distance"]])
    assert (data["pix_to_face"][3] != NO_FACE).sum() > 20
    assert not np.array_equal(data["pix_to_face"][3], data["pix_to_face"][0])  # a different viewpoint
    with pytest.raises(BadInputError, match="image list not found"):
        load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("car",), ood_cv_root=str(ood_root)))
    with pytest.raises(BadInputError, match="unknown OOD-CV nuisance"):
        load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("car",), ood_cv_root=str(ood_root),
                                   nuisances=("occlusion",)))
    with pytest.raises(BadInputError, match="OOD-CV root not found"):
        load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("car",), ood_cv_root=str(ood_root / "x")))


def test_reader_rejects_a_missing_root_and_a_missing_cad_model(pascal_root, tmp_path):
    with pytest.raises(BadInputError, match="root not found"):
        load_pascal3d(Pascal3DSpec(root=str(tmp_path / "nowhere"), classes=("car",)))
    with pytest.raises(BadInputError, match="cad_index"):
        load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("car",), cad_index=3))
    with pytest.raises(BadInputError, match="not found"):
        load_pascal3d(Pascal3DSpec(root=str(pascal_root), classes=("bus",)))


def test_cave_command_trains_on_a_pascal3d_directory(cli, pascal_root, ood_root, tmp_path):
    pytest.importorskip("open3d")
    (ood_root / "lists" / "car_pose.txt").rename(ood_root / "lists" / "car_weather.txt")
    r = cli(["explain", "cave", "-d", f"pascal3d:{pascal_root}", "--set", "classes=[car]", "--set", "image_size=32",
             "--set", f"ood_cv_root={ood_root}", "--set", "ood_cv_nuisances=[weather]",
             "--set", "n_vertices=40", "--set", "clutter_queue=16", "--concepts", "2", "--epochs", "1",
             "--no-baselines", "--set", "figures=false", "--out", tmp_path / "run"])
    assert r.exit_code == 0, r.stderr
    data = load_dataset(tmp_path / "run" / "dataset.npz")
    assert len(data["labels"]) == 5 and "fovs" in data
    import json

    cave_row = json.loads((tmp_path / "run" / "run.json").read_text())["metrics"]["rows"][0]
    # one class: every prediction is "car", so the OOD split's accuracy is exactly 1 if its 2 images were scored
    # (a split that lost its images would give NaN/None, a mislabelled one 0)
    assert sorted(set(data["split"].tolist())) == ["ood_weather", "test", "train"]
    assert list(data["split"]).count("ood_weather") == 2
    assert cave_row["acc_ood_weather"] == 1.0
    assert (tmp_path / "run" / "attributions_cave.npz").is_file()
