"""`pubswap deploy`: TLS certificates, SuperNode keys and the exact commands of a multi-organization Flower deployment.

    pubswap deploy certs --out DIR [--host NAME_OR_IP ...]     CA + SuperLink server certificate (SAN: localhost,
                                                               127.0.0.1 and every --host)
    pubswap deploy key --org NAME --out DIR                    an organization's SuperNode auth key pair (EC P-384,
                                                               OpenSSH format): DIR/NAME and DIR/NAME.pub
    pubswap deploy commands --dir DIR --superlink HOST:PORT \\
        --org NAME --data PATH --state-dir PATH [--model M] [--task-mix MIX] [--port P] ...
                                                               the SuperLink, registration, SuperNode, connection
                                                               and `flwr run` commands, with absolute paths

Which file goes where: ca.crt to every SuperNode and to the `flwr` CLI machine (`--root-certificates`,
`root-certificates` in config.toml); ca.crt, server.pem and server.key to the SuperLink machine only; ca.key stays
offline with whoever issues certificates; each organization keeps its private key NAME and sends NAME.pub to the
federation operator, who registers it with `flwr supernode register`. docs/deployment.md walks through it.

The package, by job: certificates (the CA and SuperLink certificate), keys (SuperNode auth keys), files (owner-only
directories, atomic writes), plan (organizations' specs checked and resolved), commands (the shell text) and cli
(`pubswap deploy`). Named deployment, not deploy, because the `deploy.*` config section is the warm worker
(pubswap_flwr/node/warm/).
"""

from .certificates import (
    CERT_FILES,
    build_certificates,
    certificate_names,
    check_address_in_certificate,
    make_certs,
    san_entries,
)
from .cli import register
from .commands import SUPERNODE_ENV, deployment_commands
from .files import DeployError
from .keys import check_org_name, make_org_key
from .plan import (
    DEFAULT_CONNECTION,
    DEFAULT_NODE_PORT,
    PROJECT,
    DeploymentPlan,
    Org,
    node_config,
    parse_superlink,
    plan_deployment,
)

__all__ = ["CERT_FILES", "DEFAULT_CONNECTION", "DEFAULT_NODE_PORT", "DeployError", "DeploymentPlan", "Org", "PROJECT",
           "SUPERNODE_ENV", "build_certificates", "certificate_names", "check_address_in_certificate",
           "check_org_name", "deployment_commands", "make_certs", "make_org_key", "node_config", "parse_superlink",
           "plan_deployment", "register", "san_entries"]
