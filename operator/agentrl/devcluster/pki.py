"""Certificates for the local control plane: a CA, serving certificates, client certificates
whose subjects RBAC understands, and the service-account signing key.

Generated once per cluster state directory; ``up`` twice reuses them, so kubeconfigs handed out
earlier keep working.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate: file stem, common name (user) and organisations (groups)."""

    stem: str
    common_name: str
    organizations: tuple[str, ...] = ()


#: Components and the identity each authenticates with. The controller manager and scheduler
#: use their real system identities so the bootstrap RBAC policy applies to them as in a real
#: cluster; the admin is a cluster-admin through system:masters.
CLIENTS = (
    ClientIdentity("admin", "agentrl-admin", ("system:masters",)),
    ClientIdentity("kube-controller-manager", "system:kube-controller-manager"),
    ClientIdentity("kube-scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "kwok-controller", ("system:masters",)),
    ClientIdentity(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
    ),
)

APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name(attrs)


def _issue(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate | None,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject if ca_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )
    if ca_cert is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        )
    else:
        usages = []
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), False)
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue_pair(
    directory: Path,
    stem: str,
    subject: x509.Name,
    *,
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
    server: bool = False,
) -> tuple[Path, Path]:
    """A new key and a certificate for ``subject`` signed by ``ca``, written as
    ``STEM.key``/``STEM.crt`` under ``directory``; returns (cert, key)."""
    ca_key, ca_cert = ca
    key = _key()
    cert = _issue(
        subject=subject,
        key=key,
        ca_key=ca_key,
        ca_cert=ca_cert,
        server_names=server_names,
        server_ips=server_ips,
        client=client,
        server=server,
    )
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path, key_path


def ensure_pki(directory: Path, *, service_ip: str) -> Path:
    """Create (once) every key and certificate under ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "complete").exists():
        return directory
    ca_key = _key()
    ca_cert = _issue(subject=_name("agentrl-dev-ca"), key=ca_key, ca_key=ca_key, ca_cert=None)
    _write_key(directory / "ca.key", ca_key)
    _write_cert(directory / "ca.crt", ca_cert)
    ca = (ca_key, ca_cert)
    _issue_pair(directory, "apiserver", _name("kube-apiserver"), ca=ca, server=True,
                server_names=APISERVER_DNS, server_ips=("127.0.0.1", service_ip))
    _issue_pair(directory, "kwok-server", _name("kwok-kubelet"), ca=ca, server=True,
                server_names=("localhost",), server_ips=("127.0.0.1",))
    for ident in CLIENTS:
        _issue_pair(
            directory, ident.stem, _name(ident.common_name, ident.organizations), ca=ca,
            client=True,
        )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    (directory / "complete").write_text("ok\n")
    return directory


def _load_ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca.key'} is not the EC key this module writes")
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    return ca_key, ca_cert


def ensure_client(directory: Path, ident: ClientIdentity) -> tuple[Path, Path]:
    """A client certificate signed by the cluster's CA (made once); returns (cert, key)."""
    cert_path, key_path = directory / f"{ident.stem}.crt", directory / f"{ident.stem}.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    return _issue_pair(
        directory, ident.stem, _name(ident.common_name, ident.organizations),
        ca=_load_ca(directory), client=True,
    )


def ensure_serving(
    directory: Path, stem: str, *, common_name: str, names: tuple[str, ...], ips: tuple[str, ...]
) -> tuple[Path, Path]:
    """A serving certificate for ``names``/``ips`` signed by the cluster's CA (made again
    when the recorded names or addresses differ); returns (cert, key)."""
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    if cert_path.exists() and key_path.exists():
        current = x509.load_pem_x509_certificate(cert_path.read_bytes())
        try:
            san = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            have = (
                tuple(san.get_values_for_type(x509.DNSName)),
                tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress)),
            )
        except x509.ExtensionNotFound:
            have = ((), ())
        if have == (names, ips):
            return cert_path, key_path
    return _issue_pair(
        directory, stem, _name(common_name), ca=_load_ca(directory),
        server_names=names, server_ips=ips, server=True,
    )


def node_identity(node: str) -> ClientIdentity:
    """The kubelet's identity: the Node authorizer and NodeRestriction admit exactly this."""
    return ClientIdentity(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",))


#: kube-proxy's identity: the bootstrap policy binds system:node-proxier to this user.
KUBE_PROXY = ClientIdentity("kube-proxy", "system:kube-proxy")
