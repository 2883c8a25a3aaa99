"""Which hosts a make target or a fab task acts on, read from the Ansible inventory itself.

HOST is an inventory group (its members), an inventory host, `localhost` (this machine, local
connection) or any other name, which is reached as a bare hostname/IP. Without the real inventory
(inventory/hosts.yml, untracked) a name of the example inventories is refused: their addresses
are placeholders, never to be connected to. inventory/localhost.yml is always a source, so
inventory/group_vars/all.yml applies to every target, a bare one included.

Variables of a host (for Fabric) are the roles' defaults under the inventory's variables,
rendered by Ansible's own templar: the fabfiles restate no default.

Exit: 0 ok (or the exit status of COMMAND), 1 unknown/placeholder host or missing inventory,
2 usage error.
Examples:
  ansible_targets.py --host glm5_cluster                  # print the ansible-playbook options
  ansible_targets.py --host gpu01 --members               # print the hosts it stands for
  ansible_targets.py --host gpu01 -- .venv/bin/ansible-playbook playbooks/site.yml
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO / "inventory" / "hosts.yml"
LOCAL_INVENTORY = REPO / "inventory" / "localhost.yml"
EXAMPLES = (REPO / "inventory" / "hosts.example.yml", REPO / "inventory" / "cluster.example.yml")
ROLES = REPO / "playbooks" / "roles"
CREATE = (
    "create inventory/hosts.yml (copy inventory/hosts.example.yml or cluster.example.yml and "
    "put your hosts' addresses in it)"
)


class TargetError(Exception):
    """One line for the user: what is wrong and what to do."""


def inventory_file(explicit: str | os.PathLike | None) -> Path | None:
    """The user's inventory: EXPLICIT (must exist), else inventory/hosts.yml if present."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise TargetError(f"inventory {path} not found; {CREATE}, or point to an existing one")
        return path
    return DEFAULT_INVENTORY if DEFAULT_INVENTORY.is_file() else None


def _manager(sources: list[Path]):
    # Imported here: `--help` and the error paths stay fast, and only the controller venv has it.
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    loader = DataLoader()
    return loader, InventoryManager(loader=loader, sources=[str(s) for s in sources])


def _names(sources: list[Path]) -> set[str]:
    _, inv = _manager(sources)
    return set(inv.groups) - {"all", "ungrouped"} | {h.name for h in inv.get_hosts("all")}


@dataclass
class Targets:
    """HOST resolved against the inventory: the ansible options and the member hosts."""

    name: str
    inventory: Path | None
    kind: str  # group | host | localhost | bare
    members: list[str]
    options: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = self.inventory or "no inventory/hosts.yml"
        what = {
            "group": f"group in {where}: {' '.join(self.members) or '(no hosts)'}",
            "host": f"host in {where}",
            "localhost": "this machine, local connection",
            "bare": "not in the inventory: reached as a bare hostname/IP",
        }[self.kind]
        return f"targets: {self.name} ({what})"


def resolve(name: str, explicit_inventory: str | os.PathLike | None = None) -> Targets:
    if not name:
        raise TargetError("set HOST= (an inventory group or host, a hostname or an IP)")
    user = inventory_file(explicit_inventory)
    sources = [LOCAL_INVENTORY] + ([user] if user else [])
    _, inv = _manager(sources)
    options = [opt for s in sources for opt in ("-i", str(s))]
    if user and name in set(inv.groups) - {"all", "ungrouped"}:
        members = [h.name for h in inv.get_hosts(name)]
        if not members:
            raise TargetError(f"group {name} in {user} has no hosts")
        return Targets(name, user, "group", members, [*options, "-l", name])
    if name == "localhost":
        return Targets(name, user, "localhost", [name], [*options, "-l", name])
    if user and inv.get_host(name) is not None:
        return Targets(name, user, "host", [name], [*options, "-l", name])
    placeholder = [p.name for p in EXAMPLES if p.is_file() and name in _names([p])]
    if placeholder and user is None:
        raise TargetError(
            f"HOST={name} is a placeholder of inventory/{placeholder[0]} and there is no "
            f"inventory/hosts.yml; {CREATE}"
        )
    if placeholder:
        raise TargetError(f"HOST={name} is not in {user} (only in inventory/{placeholder[0]})")
    return Targets(name, user, "bare", [name], [*options, "-i", f"{name},", "-l", name])


def all_hosts(explicit_inventory: str | os.PathLike | None = None) -> list[str]:
    """Every host of the user's inventory (never the example's); an error when there is none."""
    user = inventory_file(explicit_inventory)
    if user is None:
        raise TargetError(f"no inventory: {CREATE}, or set GLM5_INVENTORY")
    _, inv = _manager([user])
    return sorted(h.name for h in inv.get_hosts("all"))


class HostVars:
    """A host's variables as a play sees them (role defaults < inventory), rendered by Ansible."""

    def __init__(self, name: str, explicit_inventory: str | os.PathLike | None = None) -> None:
        from ansible.template import Templar, trust_as_template
        from ansible.vars.manager import VariableManager

        def trusted(value):
            # Role defaults are the repository's own code: their Jinja is meant to be rendered.
            if isinstance(value, str):
                return trust_as_template(value)
            if isinstance(value, list):
                return [trusted(v) for v in value]
            if isinstance(value, dict):
                return {k: trusted(v) for k, v in value.items()}
            return value

        user = inventory_file(explicit_inventory)
        sources = [LOCAL_INVENTORY] + ([user] if user else [])
        loader, inv = _manager(sources)
        if inv.get_host(name) is None:
            inv.add_host(name, group="all")  # a bare host still gets group_vars/all.yml
        variables: dict = {}
        for defaults in sorted(ROLES.glob("*/defaults/main.yml")):
            variables.update(trusted(loader.load_from_file(str(defaults)) or {}))
        variables.update(
            VariableManager(loader=loader, inventory=inv).get_vars(host=inv.get_host(name))
        )
        self.name = name
        self.raw = variables
        self._templar = Templar(loader=loader, variables=variables)

    def __getitem__(self, key: str):
        if key not in self.raw:
            raise TargetError(f"{self.name}: variable {key} is defined nowhere (roles, inventory)")
        return self._templar.template(self.raw[key])

    def get(self, key: str, default=None):
        return self[key] if key in self.raw else default


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    # Not cli_args.parser: the fabfiles import this module as scripts.ansible_targets.
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.split("Examples:\n", 1)[1].splitlines()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", required=True, help="group, host, localhost, hostname or IP")
    parser.add_argument(
        "--inventory", type=Path, help="inventory file (default: inventory/hosts.yml if it exists)"
    )
    parser.add_argument("--members", action="store_true", help="print the member hosts")
    args = parser.parse_args(argv)
    try:
        targets = resolve(args.host, args.inventory)
    except TargetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.members:
        print("\n".join(targets.members))
        return 0
    if not command:
        print("\n".join(targets.options))
        return 0
    print(targets.describe(), file=sys.stderr, flush=True)
    # exec: Ctrl-C and the exit status belong to the command itself
    os.execvp(command[0], [command[0], *targets.options, *command[1:]])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
