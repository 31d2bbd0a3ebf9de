"""The real node's pure parts: the OCI archives we write (read back with tarfile and hashlib,
as an image-layout reader would), the node's addresses and the configuration it is given."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import yaml

from agentrl.devcluster.node import addons, config, oci, realnode


def _plan(cluster: str = "t", index: int = 0) -> config.NodePlan:
    return config.NodePlan(
        cluster=cluster,
        index=index,
        state_dir=Path("/state") / cluster,
        apiserver_port=26443,
        pod_cidr="10.244.0.0/16",
        service_cidr="10.96.0.0/16",
    )


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_an_archive_is_an_oci_layout_whose_digests_match_its_blobs(tmp_path: Path) -> None:
    binary = tmp_path / "prog"
    binary.write_bytes(b"\x7fELF not really")
    spec = oci.ImageSpec(
        name="agentrl.local/x:1",
        entries=[
            oci.Entry("bin/prog", binary, 0o755),
            oci.Entry("bin/sh", link="prog"),
            oci.Entry("tmp", mode=0o1777),
        ],
        entrypoint=["/bin/prog"],
    )
    digest = oci.write_archive(spec, tmp_path / "x.tar")
    files = _members(tmp_path / "x.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (desc,) = index["manifests"]
    assert desc["digest"] == digest
    assert desc["annotations"]["io.containerd.image.name"] == "agentrl.local/x:1"
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(files[f"blobs/sha256/{digest.split(':')[1]}"])
    config_blob = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    layer_digest = manifest["layers"][0]["digest"]
    # an uncompressed layer: its diff id is its digest
    assert config_blob["rootfs"]["diff_ids"] == [layer_digest]
    assert config_blob["config"]["Entrypoint"] == ["/bin/prog"]
    layer = files[f"blobs/sha256/{layer_digest.split(':')[1]}"]
    with tarfile.open(fileobj=__import__("io").BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    assert entries["bin"].isdir()
    assert entries["bin/prog"].mode == 0o755 and entries["bin/prog"].size == len(
        b"\x7fELF not really"
    )
    assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "prog"
    assert entries["tmp"].isdir() and entries["tmp"].mode == 0o1777
    assert oci.archive_refs(tmp_path / "x.tar") == {"agentrl.local/x:1": digest}


def test_archive_blobs_lists_every_blob_with_its_size_from_the_tar_headers(
    tmp_path: Path,
) -> None:
    binary = tmp_path / "prog"
    binary.write_bytes(b"\x7fELF" * 100)
    spec = oci.ImageSpec(name="agentrl.local/z:1", entries=[oci.Entry("bin/prog", binary)])
    oci.write_archive(spec, tmp_path / "z.tar")
    # independently: hash every blob member's bytes, as an image-layout reader would
    expected = {
        f"sha256:{hashlib.sha256(data).hexdigest()}": len(data)
        for name, data in _members(tmp_path / "z.tar").items()
        if name.startswith("blobs/sha256/")
    }
    assert len(expected) == 3  # manifest, config, one layer
    assert oci.archive_blobs(tmp_path / "z.tar") == expected


def test_disk_check_counts_new_blobs_twice_plus_the_kubelets_reserve() -> None:
    gib = 2**30
    blobs = {"sha256:base": 5 * gib, "sha256:app": 1 * gib, "sha256:cfg": 1000}
    total = 100 * gib
    reserve = total * config.EVICTION_DISK_PERCENT // 100
    # the base layer is already in the content store: only app and cfg are new
    need = 2 * (1 * gib + 1000) + reserve
    assert realnode.disk_shortfall(blobs, {"sha256:base"}, free=need, total=total) is None
    short = realnode.disk_shortfall(blobs, {"sha256:base"}, free=need - 1, total=total)
    assert short == realnode.DiskShortfall(needed=need, layers=1 * gib + 1000, free=need - 1)
    # nothing present: all three are new
    short = realnode.disk_shortfall(blobs, set(), free=10 * gib, total=total)
    assert short is not None and short.layers == 6 * gib + 1000
    assert short.needed == 12 * gib + 2000 + reserve


def test_the_same_files_give_the_same_digest(tmp_path: Path) -> None:
    binary = tmp_path / "prog"
    binary.write_bytes(b"same")
    spec = oci.ImageSpec(name="agentrl.local/y:1", entries=[oci.Entry("prog", binary)])
    first = oci.write_archive(spec, tmp_path / "a.tar")
    binary.touch()  # a new mtime changes nothing
    assert oci.write_archive(spec, tmp_path / "b.tar") == first


def test_node_addresses_are_a_point_to_point_link_and_a_pod_slice() -> None:
    plan = _plan()
    link = ipaddress.ip_network(f"{plan.host_ip}/30", strict=False)
    assert link.subnet_of(config.LINK_NET)  # type: ignore[arg-type]
    assert ipaddress.ip_address(plan.node_ip) in link
    assert plan.host_ip != plan.node_ip
    assert plan.pod_subnet == "10.244.128.0/24" and plan.pod_gateway == "10.244.128.1"
    assert _plan(index=3).pod_subnet == "10.244.131.0/24"
    assert len(plan.host_veth) <= 15 and len(plan.host_veth + "n") <= 15
    # another cluster's node gets another link and interface
    other = _plan("other")
    assert (other.host_veth, other.host_ip) != (plan.host_veth, plan.host_ip)


def test_the_pod_network_never_masquerades_nor_routes_outside_the_cluster() -> None:
    plan = _plan()
    conf = config.cni_conflist(plan)
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["isDefaultGateway"] is False
    routes = {r["dst"] for r in bridge["ipam"]["routes"]}
    assert routes == {"10.244.0.0/16", "10.96.0.0/16"}
    assert bridge["ipam"]["dataDir"].startswith(str(plan.dir))
    assert {p["type"] for p in conf["plugins"]} == {"bridge", "portmap"}


def test_containerd_keeps_all_its_state_under_the_node_directory() -> None:
    plan = _plan()
    parsed = tomllib.loads(
        config.containerd_toml(plan, pause_image="agentrl.local/pause:1", cni_bin_dir=Path("/c"))
    )
    for path in (parsed["root"], parsed["state"], parsed["grpc"]["address"]):
        assert path.startswith(str(plan.dir) + "/")
    cri = parsed["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "agentrl.local/pause:1"
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False and runc["Root"].startswith(str(plan.dir))
    assert cri["cni"]["conf_dir"].startswith(str(plan.dir))
    assert parsed["metrics"]["address"] == ""


def test_the_kubelet_registers_tainted_with_cgroupfs_and_cluster_dns() -> None:
    plan = _plan()
    kc = config.kubelet_config(plan, ca=Path("/ca"), cert=Path("/c"), key=Path("/k"))
    assert kc["cgroupDriver"] == "cgroupfs" and kc["failSwapOn"] is False
    assert kc["cgroupRoot"] == "/agentrl-t-real-0"
    assert kc["clusterDNS"] == ["10.96.0.10"]
    assert kc["authentication"]["anonymous"]["enabled"] is False
    assert kc["authorization"]["mode"] == "Webhook"
    assert kc["registerWithTaints"] == [config.REAL_NODE_TAINT]
    assert kc["address"] == plan.node_ip
    assert kc["imageGCHighThresholdPercent"] == 100  # local images cannot be pulled again
    kubeconfig = yaml.safe_load(
        config.kubeconfig(plan, user="u", ca=Path("/ca"), cert=Path("/c"), key=Path("/k"))
    )
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster["server"] == f"https://{plan.host_ip}:26443"
    assert cluster["tls-server-name"] == "kubernetes"


def test_coredns_serves_only_the_cluster_domain_and_forwards_nowhere() -> None:
    plan = _plan()
    corefile = addons.corefile(plan)
    assert corefile.startswith("cluster.local:53 {")
    assert "forward" not in corefile and "proxy" not in corefile
    manifests = {m["kind"]: m for m in addons.coredns_manifests(plan, image="img:1")}
    assert manifests["Service"]["spec"]["clusterIP"] == "10.96.0.10"
    assert manifests["Service"]["metadata"]["name"] == "kube-dns"
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "real-0"}
    assert manifests["Deployment"]["spec"]["replicas"] == 1
