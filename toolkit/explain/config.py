"""The configs of `iclrkit explain fame | verix | cave | consistency` (light to import: the CLI builds its options from
these fields, so each knob is declared once, here)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.registry import declare

declare("explain", "toolkit.explain.methods")  # the formal explainers (FAME, VeriX), one module each
# the flags every formal explainer offers (an explainer adds its own between data/box and verify/attack)
FORMAL_FLAGS = ["model", "data", "epsilon", "n_samples"]
FORMAL_TAIL = ["verify", "attack"]


class Explainer(Protocol):
    """A registered formal explainer (toolkit/explain/methods/): explains `config.n_samples` images of `config.model`
    on its ε-box, writes its outputs under ctx and returns the metrics."""

    def __call__(self, config: Any, ctx: Any) -> dict: ...


class FormalConfig(BaseConfig):
    """What the formal explainers (FAME and its VeriX/VERIX+ baseline) share: the network, the images, the eps-box,
    the attack that proves pixels necessary and the optional MILP check."""

    model: str = Field(description="Network: a folder (config.json + model.safetensors), an .onnx file or zoo:NAME.",
                       json_schema_extra={"short": "-m"})
    data: str = Field("digits", description="Images: digits[:test|:train] (scikit-learn's bundled set), .npy, or .npz "
                                            "with x (and y), values in [0, 1].", json_schema_extra={"short": "-d"})
    epsilon: float = Field(0.05, gt=0, description="L-inf radius of the perturbation box (clipped to [0, 1]).")
    n_samples: int = Field(100, ge=1, description="Images to explain (the first qualifying ones).",
                           json_schema_extra={"short": "-n"})
    start: int = Field(0, description="First image index considered.")
    skip_robust: bool = Field(True, description="Skip images whose label is certified on the full box (empty "
                                                "explanation).")
    attack: Literal["pgd", "fgsm", "none"] = Field("pgd", description="Attack proving pixels necessary (size_min, "
                                                                      "the distance to minimality).")
    attack_steps: int = Field(20, description="Attack steps.")
    attack_restarts: int = Field(2, description="Attack restarts.")
    verify: Literal["none", "exact"] = Field("none", description="exact: prove each explanation sufficient with a "
                                                                 "MILP (SCIP).")
    exact_time_limit: float = Field(30.0, description="Seconds per MILP.")
    overlays: int = Field(16, description="Images drawn in overlays.png (0: none).")


class FameConfig(FormalConfig):
    """`iclrkit explain fame`. Defaults follow the official scripts (notebooks/script_*.py): eps 0.05 (MNIST),
    greedy knapsack, iterative refinement, FGSM/PGD lower bound; samples already robust on the box are skipped."""

    bound_method: Literal["crown", "ibp"] = Field("crown", description="IBP gives no linear bound: only the "
                                                                       "singleton phase then.")
    knapsack: Literal["greedy", "exact"] = Field("greedy", description="greedy, or exact (0/1 multi-dimensional "
                                                                       "knapsack solved by SCIP).")
    refine_domain: bool = Field(True, description="Repeat batch freeing on the shrunken domain until nothing more "
                                                  "is freed.")
    singleton_phase: bool = Field(True, description="Finish with the binary-search singleton phase on the plain "
                                                    "box.")
    refine: Literal["none", "exact"] = Field("none", description="exact: a VeriX-style MILP pass over the "
                                                                 "undecided pixels.")


class VerixConfig(FormalConfig):
    """`iclrkit explain verix`: sequential traversal with a CROWN or exact oracle (same data/eps knobs as FAME)."""

    order: Literal["bounds", "sensitivity"] = Field(
        "bounds", description="bounds (VERIX+: the CROWN margin of each pixel alone) | sensitivity (VeriX: the drop "
                              "of the label logit when the pixel is flipped to 1 - x).")
    oracle: Literal["crown", "ibp", "exact"] = Field("crown", description="Sufficiency oracle: CROWN or IBP bounds, "
                                                                          "or exact (MILP).")


class CaveConfig(BaseConfig):
    """`iclrkit explain cave`. Paper/official defaults where they transfer (T = 0.07, bank momentum 0.9,
    5 clutter features per image, visibility threshold 0.1, K-means concepts); sizes scaled to a CPU: ~200
    vertices instead of ~1130, 8 concepts per class instead of 20 (the paper's D-sweep 5..40 is flat), d = 32."""

    data: str = Field("synthetic", description="'synthetic' (rendered here), 'pascal3d:ROOT' (PASCAL3D+ release1.1 "
                                               "layout, toolkit/explain/cave_pascal3d.py; classes via --set "
                                               "classes=[car]) or a dataset .npz written by a previous run (both "
                                               "are saved as OUT/dataset.npz).", json_schema_extra={"short": "-d"})
    classes: list[str] = ["aeroplane", "car"]  # pascal3d: the categories to load
    ood_cv_root: str | None = None  # pascal3d: an OOD-CV pose release; its nuisances add splits acc_ood_<nuisance>
    ood_cv_nuisances: list[str] = ["context", "pose", "shape", "texture", "weather"]
    n_classes: int = 4  # synthetic: first n of car, house, mug, plane
    n_train_per_class: int = 100  # synthetic
    n_test_per_class: int = 40  # synthetic: per OOD split as well
    image_size: int = 64  # synthetic renders are image_size x image_size
    occlusion_fraction: float = 0.4  # synthetic occlusion split: share of object pixels hidden
    noise_std: float = 0.2  # synthetic noise split
    feature_dim: int = 32  # backbone feature channels d
    width: int = 32  # channels of the first conv layer (the next two have 2x)
    n_vertices: int = 200  # NOV vertices per class on the ellipsoid
    concepts_per_class: int = Field(8, ge=1, description="D: K-means concepts per class.",
                                    json_schema_extra={"flag": "--concepts"})
    background_concepts: int = 8  # K-means centres of the clutter queue that compete with the concepts
    temperature: float = 0.07
    bank_momentum: float = 0.9
    clutter_per_image: int = 5  # background features per image added to the clutter queue
    clutter_queue: int = 512
    neighbour_px: float = 6.0  # same-volume vertices projected closer than this are not negatives
    visibility_threshold: float = 0.1  # concepts come from vertices visible in more than this share of images
    classifier: Literal["repo", "paper"] = Field("repo", description="repo (FeatureMatchingCAVE) | paper.")
    explain_temperature: float = 0.07  # soft concept assignment of the explanations (the training temperature)
    # explanation of the concept relevances: 'lrp' (the paper's: NOV-aware rule at the matching layer, then LRP
    # layer by layer through the backbone, toolkit/explain/lrp.py) or 'gaussian' (the earlier stand-in: a
    # conservative Gaussian upsampling of the cell relevances, sigma relevance_sigma_px)
    explanation: Literal["lrp", "gaussian"] = "lrp"
    lrp_top_rule: Literal["epsilon", "zplus"] = "epsilon"  # rule of the last conv; zbox at the pixels, zplus between
    relevance_sigma_px: float = 7.0  # gaussian: Gaussian of the ~29 px receptive field / 4
    epochs: int = Field(40, ge=1, description="NOVUM training epochs.")
    batch_size: int = 32
    lr: float = 1e-3
    baselines: bool = Field(True, description="Also train and score the 2D CNN baselines (NMF (CRAFT-lite) "
                                              "concepts and Grad-CAM).")
    baseline_epochs: int = 40
    baseline_lrp: bool = False  # also the CNN's LRP map (same composite as CAVE's LRP) as a baseline row
    figures: bool = True


class ConsistencyConfig(BaseConfig):
    """`iclrkit explain consistency`: 3D-C of any concept method's maps on a posed dataset with meshes."""

    data: str = Field(description="Dataset .npz with pix_to_face and meshes (format in toolkit/explain/cave_data.py), "
                                  "e.g. OUT/dataset.npz of `explain cave`.", json_schema_extra={"short": "-d"})
    attributions: str = Field(description=".npz with maps (N, D, H, W) for the concepts of each image's class and "
                                          "index (N,) into the dataset.", json_schema_extra={"short": "-a"})
    method: str = Field("", description="Method name for the report (default: the attribution file's `method` "
                                        "entry or its name).")
