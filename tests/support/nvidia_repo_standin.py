"""Stand-in for NVIDIA's CUDA apt repository (and a distribution archive), gpg-signed, for tests.

Laid out like https://developer.download.nvidia.com/compute/cuda/repos/<distdir>/x86_64/ (a flat
"/" repository) so the nvidia_driver and cuda_toolkit roles run unchanged against it, with
nvidia_driver_repo_base=<url>/compute/cuda/repos. Packages carry the names and versions the roles
install; their contents are stand-ins (no GPU, no kernel module):
- cuda-keyring 1.1-1: the key, the source list and the pin, the three things NVIDIA's ships;
- nvidia-open-580 580.95.05-1: an nvidia-smi that answers only once the "module" is loaded, a
  persistence daemon, and a boot unit that makes /proc/driver/nvidia/version appear, so the
  driver looks loaded only after a reboot, as with the real one;
- cuda-toolkit-13-0 13.0.2-1: an nvcc that reports release 13.0.
The "distribution" archive has the headers package of the running kernel (Debian has none for
this host's kernel) and a light dkms. Adapted from the recipe's 05-standin-repo.sh.

Host needs dpkg-dev (dpkg-deb), apt-utils (apt-ftparchive) and gpg; installed when missing.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

from support.nspawn_targets import _run, ensure_host_packages

BRANCH = "580"
DRIVER = "580.95.05"
CUDA = "13.0"
KEYRING_VERSION = "1.1-1"
PACKAGES = {  # name -> version, as the roles ask apt for them
    "cuda-keyring": KEYRING_VERSION,
    f"nvidia-open-{BRANCH}": f"{DRIVER}-1",
    f"cuda-toolkit-{CUDA.replace('.', '-')}": f"{CUDA}.2-1",
}


def _deb(work: Path, name: str, version: str, arch: str, depends: str, out: Path) -> None:
    """Build NAME from the files under WORK/NAME (the control file is written here)."""
    root = work / name
    (root / "DEBIAN").mkdir(parents=True, exist_ok=True)
    control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
               "Maintainer: standin <standin@localhost>"]  # fmt: skip
    if depends:
        control.append(f"Depends: {depends}")
    control += ["Section: misc", "Priority: optional",
                f"Description: test stand-in for {name} (no real content)"]  # fmt: skip
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    upstream = version.split(":", 1)[-1]
    _run(
        "dpkg-deb", "--root-owner-group", "-Zxz", "-b", root, out / f"{name}_{upstream}_{arch}.deb"
    )


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _index(directory: Path, label: str, gnupg: Path) -> None:
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    packages = _run("apt-ftparchive", "packages", ".", cwd=directory).stdout
    (directory / "Packages").write_text(packages)
    (directory / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
    release = _run(
        "apt-ftparchive", "-o", f"APT::FTPArchive::Release::Origin={label}",
        "-o", f"APT::FTPArchive::Release::Label={label}",
        "-o", "APT::FTPArchive::Release::Architectures=amd64 all", "release", ".",
        cwd=directory,
    ).stdout  # fmt: skip
    (directory / "Release").write_text(release)
    gpg = ["gpg", "--batch", "-q", "--yes"]
    _run(*gpg, "--clearsign", "-o", "InRelease", "Release", cwd=directory, env=env)
    _run(*gpg, "-abs", "-o", "Release.gpg", "Release", cwd=directory, env=env)


def build(repo: Path, url: str, distdir: str = "debian12", kernel: str | None = None) -> Path:
    """Write both signed repositories under REPO, as served at URL; return the keyring path."""
    ensure_host_packages({"dpkg-deb": "dpkg-dev", "apt-ftparchive": "apt-utils", "gpg": "gpg"})
    kernel = kernel or os.uname().release
    nv = repo / f"compute/cuda/repos/{distdir}/x86_64"
    dist = repo / "standin-distro"
    nv.mkdir(parents=True)
    dist.mkdir(parents=True)
    gnupg = Path(tempfile.mkdtemp(prefix="gnupg-"))
    gnupg.chmod(0o700)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    try:
        _run("gpg", "--batch", "-q", "--passphrase", "", "--quick-gen-key",
             "Stand-in CUDA repository <standin@localhost>", "ed25519", "sign", "never",
             env=env)  # fmt: skip
        keyring = repo / "cuda-archive-keyring.gpg"
        keyring.write_bytes(subprocess.run(["gpg", "--export"], env=env, capture_output=True,
                                           check=True).stdout)  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix="debs-"))
        try:
            _packages(work, nv, dist, keyring, url, distdir, kernel)
            _index(nv, "NVIDIA CUDA", gnupg)
            _index(dist, "standin-distro", gnupg)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        _run("gpgconf", "--kill", "gpg-agent", env=env, check=False)
        shutil.rmtree(gnupg, ignore_errors=True)
    return keyring


def _packages(
    work: Path, nv: Path, dist: Path, keyring: Path, url: str, distdir: str, kernel: str
) -> None:
    k = work / "cuda-keyring"
    (k / "usr/share/keyrings").mkdir(parents=True)
    shutil.copy(keyring, k / "usr/share/keyrings/cuda-archive-keyring.gpg")
    _write(k / f"etc/apt/sources.list.d/cuda-{distdir}-x86_64.list",
           "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
           f"{url}/compute/cuda/repos/{distdir}/x86_64/ /\n")  # fmt: skip
    _write(k / "etc/apt/preferences.d/cuda-repository-pin-600",
           "Package: *\nPin: release l=NVIDIA CUDA\nPin-Priority: 600\n")  # fmt: skip
    _deb(work, "cuda-keyring", KEYRING_VERSION, "all", "", nv)

    d = work / f"nvidia-open-{BRANCH}"
    no_driver = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    gpu = f"NVIDIA RTX PRO 6000 Blackwell Server Edition (stand-in), {DRIVER}, 12.0"
    _write(
        d / "usr/bin/nvidia-smi",
        "#!/bin/sh\n"
        f'[ -r /proc/driver/nvidia/version ] || {{ echo "{no_driver}" >&2; exit 9; }}\n'
        f'case "$*" in *--query-gpu*) echo "{gpu}";; '
        "*) cat /proc/driver/nvidia/version;; esac\n",
        0o755,
    )
    _write(d / "usr/bin/nvidia-persistenced", "#!/bin/sh\nexec sleep infinity\n", 0o755)
    _write(
        d / "lib/systemd/system/nvidia-persistenced.service",
        "[Unit]\nDescription=NVIDIA Persistence Daemon (stand-in)\n[Service]\n"
        "ExecStart=/usr/bin/nvidia-persistenced\n[Install]\nWantedBy=multi-user.target\n",
    )
    version_line = (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  Release Build  "
        "(standin)  Tue Sep 23 09:38:48 UTC 2025"
    )
    load = (
        "mount -t tmpfs -o size=64k nvidia-standin /proc/driver && mkdir /proc/driver/nvidia"
        f' && echo "{version_line}" >/proc/driver/nvidia/version'
    )
    _write(d / "lib/systemd/system/nvidia-standin-module.service", textwrap.dedent(f"""\
        [Unit]
        Description=Stand-in: "load" the NVIDIA module at boot (/proc/driver/nvidia/version)
        ConditionPathExists=!/proc/driver/nvidia/version
        [Service]
        Type=oneshot
        RemainAfterExit=yes
        ExecStart=/bin/sh -c '{load}'
        [Install]
        WantedBy=multi-user.target
        """))  # fmt: skip
    wants = d / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "nvidia-standin-module.service").symlink_to(
        "/lib/systemd/system/nvidia-standin-module.service"
    )
    _deb(work, f"nvidia-open-{BRANCH}", f"{DRIVER}-1", "amd64", "dkms", nv)

    t = work / f"cuda-toolkit-{CUDA.replace('.', '-')}"
    _write(t / f"usr/local/cuda-{CUDA}/bin/nvcc",
           f'#!/bin/sh\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
           f'echo "Cuda compilation tools, release {CUDA}, V{CUDA}.88"\n', 0o755)  # fmt: skip
    _deb(work, t.name, f"{CUDA}.2-1", "amd64", "", nv)

    # The distribution's side: this kernel's headers, and a dkms without Debian's 113 recommends.
    (work / f"linux-headers-{kernel}/usr/src/linux-headers-{kernel}").mkdir(parents=True)
    _deb(work, f"linux-headers-{kernel}", "1-standin", "amd64", "", dist)
    _write(work / "dkms/usr/sbin/dkms", '#!/bin/sh\necho "dkms stand-in: $*"\n', 0o755)
    _deb(work, "dkms", "1:3.0-standin1", "all", "", dist)


def point_node_at_distro_standin(root: Path, keyring: Path, url: str) -> None:
    """Target prep, not the playbook's job: the node's only archive is the distribution stand-in.

    The suite's network reaches nothing but the host, so the real Debian/Ubuntu archive is
    replaced, not added to (apt would fail on it).
    """
    shutil.copy(keyring, root / "usr/share/keyrings/standin-distro.gpg")
    (root / "etc/apt/sources.list").write_text("")
    for old in (root / "etc/apt/sources.list.d").glob("*"):
        old.unlink()
    (root / "etc/apt/sources.list.d/standin-distro.sources").write_text(
        f"Types: deb\nURIs: {url}/standin-distro/\nSuites: ./\n"
        "Signed-By: /usr/share/keyrings/standin-distro.gpg\n"
    )
