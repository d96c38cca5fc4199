"""Issue 21: the spec's Mounts and NodePackages, and `hp create --mount`."""

import pytest

from orchestrator.errors import BadInput, OperationFailed
from orchestrator.releases import DEFAULT
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.model import DEFAULT_SPEC, validate, with_overrides
from orchestrator.spec.userwork import mount_arg

CAT = load_catalogue()


def problems(doc, **kw):
    with pytest.raises(BadInput) as e:
        validate(doc, CAT, **kw)
    return e.value.problems


def test_mounts_and_packages_are_read(tmp_path):
    doc = {
        **DEFAULT_SPEC,
        "Mounts": [{"Source": str(tmp_path)}, {"Source": str(tmp_path), "Target": "/data", "ReadOnly": True}],
        "NodePackages": ["python3-dask", "jq", "jq", "g++"],
    }
    s = validate(doc, CAT)
    assert [(m.Source, m.target, m.ReadOnly) for m in s.Mounts] == [
        (str(tmp_path), str(tmp_path), False),
        (str(tmp_path), "/data", True),
    ]
    assert s.packages == ("g++", "jq", "python3-dask")
    assert validate(DEFAULT_SPEC, CAT).packages == ()


def test_every_mount_problem_is_named(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    doc = {
        **DEFAULT_SPEC,
        "Mounts": [
            {"Source": "relative/dir"},
            {"Source": str(tmp_path / "missing")},
            {"Source": str(f)},
            {"Source": str(tmp_path), "Target": "/etc/x"},
            {"Source": str(tmp_path), "Target": "/usr"},
            {"Source": str(tmp_path), "Target": "/proc/self"},
            {"Source": str(tmp_path), "Target": "/var"},
            {"Source": str(tmp_path), "Target": "/home"},
            {"Source": str(tmp_path), "Target": "/var/spool/slurmd/x"},
            {"Source": str(tmp_path), "Target": "/a:b"},
            {"Source": str(tmp_path), "Target": "/data/../etc"},
            {"Source": str(tmp_path), "Target": "/data"},
            {"Source": str(tmp_path), "Target": "/data/"},
        ],
    }
    p = problems(doc)
    text = "\n".join(p)
    assert "Mounts[0].Source: 'relative/dir' must be an absolute path" in text
    assert f"Mounts[1].Source: '{tmp_path / 'missing'}' does not exist" in text
    assert f"Mounts[2].Source: '{f}' is not a folder" in text
    assert "Mounts[3].Target: '/etc/x' is inside /etc" in text
    assert "Mounts[4].Target: '/usr' is inside /usr" in text
    assert "Mounts[5].Target: '/proc/self' is inside /proc" in text
    assert "Mounts[6].Target: '/var' would hide /var/lib" in text
    assert "Mounts[7].Target: '/home' is hp's /home" in text
    assert "Mounts[8].Target: '/var/spool/slurmd/x' is inside /var/spool/slurmd" in text
    assert "Mounts[9].Target: '/a:b' holds ':'" in text
    assert "Mounts[10].Target: '/data/../etc' is not a normal path" in text
    assert "Mounts[12].Target: '/data/' is already the Target of Mounts[11]" in text
    assert len(p) == 12, p
    # a folder inside /home may be mounted (a CI checkout under /home/runner is)
    validate({**DEFAULT_SPEC, "Mounts": [{"Source": str(tmp_path), "Target": "/home/runner/work"}]}, CAT)


def test_stored_spec_with_a_folder_gone_stays_readable(tmp_path):
    doc = {**DEFAULT_SPEC, "Mounts": [{"Source": str(tmp_path / "gone")}]}
    assert problems(doc)
    assert validate(doc, CAT, existing=True).Mounts[0].Source == str(tmp_path / "gone")


def test_package_names_are_debian_names_only():
    bad = ["jq; rm -rf /", "$(id)", "a", "Upper", "-o", "pkg=1.0", "X" * 300, "ok-pkg", "lib++.so-1"]
    p = problems({**DEFAULT_SPEC, "NodePackages": bad})
    assert len(p) == 7, p
    assert "NodePackages[0]: 'jq; rm -rf /' is not a Debian package name" in p[0]
    assert all(f"NodePackages[{i}]" in p[i] for i in range(6))
    assert "NodePackages[6]: 'XXX" in p[6] and "..." in p[6]
    assert problems({**DEFAULT_SPEC, "NodePackages": ["p" + str(i) for i in range(201)]}) == [
        "NodePackages: at most 200 packages, got 201"
    ]
    assert "NodePackages[0]: Input should be a valid string (got 3)" in problems({**DEFAULT_SPEC, "NodePackages": [3]})


def test_mount_arg_and_overrides(tmp_path):
    assert mount_arg("/src") == {"Source": "/src"}
    assert mount_arg("/src:/dst") == {"Source": "/src", "Target": "/dst"}
    assert mount_arg("rel") == {"Source": "rel"}
    doc = {**DEFAULT_SPEC, "Mounts": [{"Source": str(tmp_path), "Target": "/a"}]}
    s = with_overrides(doc, CAT, mounts=[str(tmp_path), f"{tmp_path}:/b"])
    assert [m.target for m in s.Mounts] == ["/a", str(tmp_path), "/b"]
    with pytest.raises(BadInput) as e:
        with_overrides(DEFAULT_SPEC, CAT, mounts=["rel", f"{tmp_path}:/etc"])
    assert e.value.problems == [
        "Mounts[0].Source: 'rel' must be an absolute path",
        "Mounts[1].Target: '/etc' is inside /etc, which the node's system or Slurm uses",
    ]


# -- NodePackages: derived images, on fakes ----------------------------------------------
def test_node_packages_build_derived_login_and_compute_images_once(tmp_path):
    from fakes import spec_doc, world

    from orchestrator.ci.images_io import images_key, save_images
    from orchestrator.cluster.create import CreateOptions, create

    w = world(tmp_path)
    builds = []
    real = w.provider.build_image

    def counting(context, tag, target, buildargs, log):
        builds.append((tag, buildargs, (context / "packages.txt").read_text()))
        real(context, tag, target, buildargs, log)

    w.provider.build_image = counting
    opts = CreateOptions(timeout=5)
    doc = spec_doc("lab", NodePackages=["jq", "bc", "jq"])
    create(w.env, validate(doc, w.env.catalogue), opts)
    refs = w.env.images(DEFAULT).refs()
    assert sorted(t.split(":")[0] for t, _, _ in builds) == ["hp-login-pkgs", "hp-worker-pkgs"]
    assert {a["PARENT"] for _, a, _ in builds} == {refs["login"], refs["worker"]}
    assert {p for _, _, p in builds} == {"bc\njq\n"}  # one a line: read by xargs, never by a shell
    spec_of = {n: w.provider._get(f"hp-lab-{n}").spec.image for n in ("controller-1", "login-1", "cpu-1")}
    assert spec_of["controller-1"] == refs["controller"]
    assert spec_of["login-1"].startswith("hp-login-pkgs:") and spec_of["cpu-1"].startswith("hp-worker-pkgs:")
    # a second cluster with the same list (in another order) builds nothing and runs the same images
    create(w.env, validate({**spec_doc("lab2"), "NodePackages": ["bc", "jq"]}, w.env.catalogue), opts)
    assert len(builds) == 2
    assert w.provider._get("hp-lab2-cpu-1").spec.image == spec_of["cpu-1"]
    # another list: other images; no list: hp's own
    create(w.env, validate(spec_doc("lab3"), w.env.catalogue), opts)
    assert len(builds) == 2 and w.provider._get("hp-lab3-cpu-1").spec.image == refs["worker"]
    # the cache key and the saved images follow the list
    assert images_key(w.env, DEFAULT) != images_key(w.env, DEFAULT, ("bc", "jq")) != images_key(w.env, DEFAULT, ("bc",))
    doc = save_images(w.env, DEFAULT, tmp_path / "saved", packages=("bc", "jq"))
    names = {i["Name"]: i["Ref"] for i in doc["Images"]}
    assert names["login-pkgs"] == spec_of["login-1"] and names["worker-pkgs"] == spec_of["cpu-1"]
    with pytest.raises(OperationFailed, match="NodePackages.*not built"):
        save_images(w.env, DEFAULT, tmp_path / "saved2", packages=("zsh",))


def test_packages_of_a_spec_document():
    from orchestrator.spec.userwork import packages_of

    assert packages_of({"NodePackages": ["jq", "bc", "jq"]}) == ("bc", "jq")
    assert packages_of({}) == () and packages_of([]) == ()
    with pytest.raises(BadInput, match="must be a list"):
        packages_of({"NodePackages": "jq"})
    with pytest.raises(BadInput, match="is not a Debian package name"):
        packages_of({"NodePackages": ["jq;id"]})
