"""Field files: HDF5 datasets of solution fields with coordinates, parameters and an XDMF view."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import h5py
import numpy as np

from diffnet.grid.material import COMPONENT_NAMES

__all__ = ["Layout", "write_statistics", "FieldFileError", "by_unknown", "write_fields", "read_fields"]


@dataclass(frozen=True)
class Layout:
    """How a family's fields are laid out: its unknowns (one: ``u`` (S, *grid); several: (S, C, *grid)) and which of
    them form vectors (name -> components, x first)."""

    unknowns: Sequence[str] = ("u",)
    vectors: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, family) -> "Layout":
        """A family's layout (its ``unknowns`` and ``vectors``)."""
        return cls(tuple(family.unknowns), dict(family.vectors))


class FieldFileError(ValueError):
    """A field file is unreadable or does not have the documented layout."""


def by_unknown(u: np.ndarray, unknowns: Sequence[str]) -> dict[str, np.ndarray]:
    """Fields by the dataset names of a field file: ``{"u": u}`` for one unknown, ``{"u_x": u[:, 0], ...}`` for
    several (``u`` (S, C, *grid), the family's ``unknowns`` in order)."""
    return {k: u[:, i] for i, k in enumerate(unknowns)} if len(unknowns) > 1 else {"u": u}


def write_fields(
    path: str | Path,
    u: np.ndarray,
    coords: dict[str, np.ndarray],
    instances: dict[str, np.ndarray],
    attrs: dict[str, object],
    domain: np.ndarray | None = None,
    layout: Layout | None = None,
    derived: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``u`` (S, N_0, N_1) or (S, N_0, N_1, N_2) with its coordinates and instance parameters, and an XDMF;
    for a family with several unknown fields, ``u`` (S, C, *grid) as one dataset per field.

    Parameters
    ----------
    path : path-like
        The ``.h5`` file to write; the ``.xdmf`` goes beside it with the same stem.
    u : numpy.ndarray
        Fields, samples first.
    coords : dict
        The nodal coordinate arrays, one per axis in axis order (e.g. ``{"t": ..., "x": ...}``).
    params : dict
        Per-sample instance parameters, each with S rows (e.g. ``{"c": (S,)}``).
    attrs : dict
        File attributes; must include ``problem``.
    domain : numpy.ndarray, optional
        For a family on a domain cut out of the grid (capability ``domain``): the signed distance at
        the nodes, u's shape. Written as ``sdf`` and as the mask ``inside`` (1 at the domain's nodes),
        both also in the XDMF, so ParaView's Threshold on ``inside`` shows the domain alone and a
        Contour of ``sdf`` at 0 its boundary.
    layout : Layout, optional
        The family's unknowns and vectors (:meth:`Layout.of`; default one unknown ``u``).
    layout.unknowns : sequence of str
        The family's unknown fields (:attr:`diffnet.protocol.family.Family.unknowns`): with one, ``u`` is the
        dataset ``u``; with several, ``u`` holds them along axis 1 and each is written as its own
        dataset of that name (S, *grid), listed in the attribute ``unknowns``.
    layout.vectors : mapping
        Unknowns that form a vector (name -> components, x first): each is written into the XDMF as a
        vector attribute of that name, which ParaView shows as arrows or warps by (a 2-D vector is
        padded with a zero z-component, as ParaView's vectors have three).

    derived : mapping, optional
        Fields derived from the solution (the family's ``derived`` capability): a scalar (S, *grid) is written as
        its own dataset and scalar attribute; a symmetric tensor (S, 3, *grid) in 2-D (xx, yy, xy) or (S, 6, *grid)
        in 3-D (xx, yy, zz, xy, yz, xz) as one dataset per component (``stress_xx``, ...) and an XDMF ``Tensor6``
        attribute of its name, which ParaView shows as a tensor (2-D: zero z entries).

    Both files are written to temporaries and renamed into place, so a reader never sees
    half a file.
    """
    path = Path(path)
    u = np.asarray(u)
    layout = layout or Layout()
    unknowns, vectors = tuple(layout.unknowns), dict(layout.vectors)
    several = len(unknowns) > 1
    if several and (u.ndim not in (4, 5) or u.shape[1] != len(unknowns)):
        raise ValueError(f"u must be (S, {len(unknowns)}, *grid) for the unknowns {list(unknowns)}, got shape {u.shape}")
    if not several and u.ndim not in (3, 4):
        raise ValueError(f"u must be (S, N0, N1) or (S, N0, N1, N2), got shape {u.shape}")
    grid = u.shape[2:] if several else u.shape[1:]
    names = list(coords)
    if len(names) != len(grid) or tuple(len(coords[n]) for n in names) != grid:
        raise ValueError(f"coordinates {[(n, len(coords[n])) for n in names]} do not match u {u.shape}")
    if vectors:
        from diffnet.protocol.family import check_vectors

        check_vectors(unknowns, vectors, len(grid))
    fields = by_unknown(u, unknowns)
    datasets = {**fields, **{n: np.asarray(coords[n], dtype=np.float64) for n in names}}
    for name, value in instances.items():
        value = np.asarray(value)
        if value.shape[:1] != u.shape[:1]:
            raise ValueError(f"parameter {name} has {value.shape[:1]} rows, expected {u.shape[0]}")
        datasets[name] = value
    nodal = {k: v.dtype for k, v in fields.items()}
    if domain is not None:
        domain = np.asarray(domain, dtype=np.float64)
        if domain.shape != (u.shape[0], *grid):
            raise ValueError(f"domain has shape {domain.shape}, expected {(u.shape[0], *grid)}")
        datasets["sdf"], datasets["inside"] = domain, (domain <= 0).astype(np.uint8)
        nodal.update(sdf=domain.dtype, inside=np.dtype(np.uint8))
    tensors = {}
    for name, value in (derived or {}).items():
        value = np.asarray(value, dtype=np.float64)
        components = COMPONENT_NAMES.get(len(grid), ())
        if value.shape == (u.shape[0], *grid):
            datasets[name], nodal[name] = value, value.dtype
        elif value.shape == (u.shape[0], len(components), *grid):
            tensors[name] = tuple(f"{name}_{c}" for c in components)
            for key, part in zip(tensors[name], np.moveaxis(value, 1, 0)):
                datasets[key], nodal[key] = part, value.dtype
        else:
            raise ValueError(f"derived field {name} has shape {value.shape}: need {(u.shape[0], *grid)} or a "
                             f"symmetric tensor {(u.shape[0], len(components), *grid)}")
    if several:
        attrs = {**attrs, "unknowns": ",".join(unknowns)}
    if derived:
        attrs = {**attrs, "derived": ",".join(derived)}
    text = _xdmf(path.name, (u.shape[0], *grid), nodal, names, {k: tuple(v) for k, v in vectors.items()}, tensors)
    _write_atomic(path, datasets, names, grid, attrs, text)
    return path


def _write_atomic(path: Path, datasets: dict[str, np.ndarray], names: list[str], shape: tuple[int, ...],
                  attrs: dict[str, object], xdmf_text: str) -> None:
    """The HDF5 file (datasets, the axes and resolution attributes, ``attrs``) and its XDMF, each written
    to a temporary and renamed into place, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in datasets.items():
                f.create_dataset(key, data=value)
            f.attrs["axes"] = ",".join(names)
            f.attrs["resolution"] = np.asarray(shape, dtype=np.int64)
            for key, value in attrs.items():
                f.attrs[key] = value
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    xdmf = path.with_suffix(".xdmf")
    tmp_x = xdmf.with_name(f".{xdmf.name}.tmp-{os.getpid()}")
    tmp_x.write_text(xdmf_text)
    os.replace(tmp_x, xdmf)


def _geometry(h5name: str, names: list[str], shape: tuple[int, ...], indent: str) -> str:
    """XDMF topology and geometry of a rectilinear node grid (2-D or 3-D); the last axis is X."""
    d = len(shape)
    items = "\n".join(f'{indent}  <DataItem Dimensions="{shape[a]}" NumberType="Float" Precision="8" '
                      f'Format="HDF">{h5name}:/{names[a]}</DataItem>' for a in reversed(range(d)))
    return (f'{indent}<Topology TopologyType="{d}DRectMesh" Dimensions="{" ".join(map(str, shape))}"/>\n'
            f'{indent}<Geometry GeometryType="{"VXVYVZ" if d == 3 else "VXVY"}">\n{items}\n{indent}</Geometry>')


def _xdmf(h5name: str, shape: tuple[int, ...], nodal: dict[str, np.dtype], names: list[str],
          vectors: dict[str, tuple[str, ...]] | None = None, tensors: dict[str, tuple[str, ...]] | None = None) -> str:
    """XDMF 3 for ParaView: one rectilinear grid (2-D or 3-D) per sample, as a collection over samples,
    with the ``nodal`` datasets (name -> dtype, each of ``shape``) as its node attributes and each of
    ``vectors`` (name -> component datasets, x first) as a vector attribute joined from its components.

    ParaView steps through a temporal collection, so the sample index is written as the
    collection's "time"; the last axis name is the grid's X, the one before its Y (then Z).
    """
    s, grid = shape[0], tuple(shape[1:])
    dims = " ".join(map(str, grid))
    d = len(grid)
    grids = []
    for k in range(s):
        start, stride, count = " ".join([str(k)] + ["0"] * d), " ".join(["1"] * (d + 1)), f"1 {dims}"

        def slab(name: str, indent: str) -> str:  # sample k of the dataset ``name``
            dtype = nodal[name]
            return (f"""{indent}<DataItem ItemType="HyperSlab" Dimensions="{dims}">
{indent}  <DataItem Dimensions="3 {d + 1}" Format="XML">{start}  {stride}  {count}</DataItem>
{indent}  <DataItem Dimensions="{s} {dims}" NumberType="{'UChar' if dtype.kind == 'u' else 'Float'}" \
Precision="{dtype.itemsize}" Format="HDF">{h5name}:/{name}</DataItem>
{indent}</DataItem>""")

        attributes = "\n".join(
            f"""        <Attribute Name="{name}" AttributeType="Scalar" Center="Node">
{slab(name, "          ")}
        </Attribute>""" for name in nodal)
        for name, parts in (vectors or {}).items():
            # ParaView's vectors have three components: a 2-D one gets a zero z, 0 * its x.
            join = ", ".join(f"${i}" for i in range(len(parts))) + (", 0 * $0" if len(parts) == 2 else "")
            items = "\n".join(slab(p, "            ") for p in parts)
            attributes += f"""
        <Attribute Name="{name}" AttributeType="Vector" Center="Node">
          <DataItem ItemType="Function" Function="JOIN({join})" Dimensions="{dims} 3">
{items}
          </DataItem>
        </Attribute>"""
        for name, parts in (tensors or {}).items():
            # XDMF's Tensor6 is xx, yy, zz, xy, yz, xz; a 2-D tensor (xx, yy, xy) gets zero z entries.
            join = "$0, $1, 0 * $0, $2, 0 * $0, 0 * $0" if len(parts) == 3 else ", ".join(f"${i}" for i in range(6))
            items = "\n".join(slab(p, "            ") for p in parts)
            attributes += f"""
        <Attribute Name="{name}" AttributeType="Tensor6" Center="Node">
          <DataItem ItemType="Function" Function="JOIN({join})" Dimensions="{dims} 6">
{items}
          </DataItem>
        </Attribute>"""
        grids.append(
            f"""      <Grid Name="sample{k}" GridType="Uniform">
        <Time Value="{k}"/>
{_geometry(h5name, names, grid, "        ")}
{attributes}
      </Grid>"""
        )
    body = "\n".join(grids)
    return f"""<?xml version="1.0" ?>
<Xdmf Version="3.0">
  <Domain>
    <Grid Name="samples" GridType="Collection" CollectionType="Temporal">
{body}
    </Grid>
  </Domain>
</Xdmf>
"""


def write_statistics(path: str | Path, fields: dict[str, np.ndarray], coords: dict[str, np.ndarray],
                     instances: dict[str, np.ndarray], attrs: dict[str, object]) -> Path:
    """Write statistics fields (``mean``, ``std``, ...) on one grid, with the instance parameters they
    summarise, and an XDMF that shows each field as an attribute of that grid. Written like
    :func:`write_fields`."""
    path = Path(path)
    names = list(coords)
    shape = tuple(len(coords[n]) for n in names)
    for key, value in fields.items():
        if np.shape(value) != shape:
            raise ValueError(f"{key} has shape {np.shape(value)}, the grid {shape}")
    dims = " ".join(map(str, shape))
    attributes = "\n".join(
        f"""      <Attribute Name="{key}" AttributeType="Scalar" Center="Node">
        <DataItem Dimensions="{dims}" NumberType="Float" Precision="8" Format="HDF">{path.name}:/{key}</DataItem>
      </Attribute>""" for key in fields)
    xdmf = f"""<?xml version="1.0" ?>
<Xdmf Version="3.0">
  <Domain>
    <Grid Name="statistics" GridType="Uniform">
{_geometry(path.name, names, shape, "      ")}
{attributes}
    </Grid>
  </Domain>
</Xdmf>
"""
    datasets = {**fields, **{n: np.asarray(coords[n], dtype=np.float64) for n in names},
                **{k: np.asarray(v) for k, v in instances.items()}}
    _write_atomic(path, datasets, names, shape, attrs, xdmf)
    return path


def read_fields(path: str | Path, max_elements: int = 2**31) -> dict[str, object]:
    """Read a field file written by :func:`write_fields`, checking its layout first.

    Shapes are checked before any data is read, so a crafted file that claims a huge
    dataset is refused without allocating it. A file of several unknown fields (attribute
    ``unknowns``) gives ``u`` as (S, C, *grid) in that order, and each field by its name too.
    """
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            unknowns = str(f.attrs.get("unknowns", "u")).split(",")
            if any(k not in f or not isinstance(f[k], h5py.Dataset) for k in unknowns):
                raise FieldFileError(f"{path}: no dataset " + ("'u'" if unknowns == ["u"] else f"of {unknowns}"))
            du = f[unknowns[0]]
            if du.ndim not in (3, 4) or du.size > max_elements or du.dtype.kind != "f":
                raise FieldFileError(f"{path}: 'u' must be a float array (S, N0, N1[, N2]), got {du.shape} {du.dtype}")
            axes = str(f.attrs.get("axes", "")).split(",")
            if len(axes) != du.ndim - 1 or any(a not in f for a in axes):
                raise FieldFileError(f"{path}: coordinate datasets missing (axes attribute {axes})")
            if any(f[k].shape != du.shape or f[k].dtype.kind != "f" for k in unknowns):
                raise FieldFileError(f"{path}: the unknowns {unknowns} differ in shape or type")
            if du.size * len(unknowns) > max_elements:
                raise FieldFileError(f"{path}: {len(unknowns)} fields of {du.shape} exceed the size limit")
            u = du[()] if len(unknowns) == 1 else np.stack([f[k][()] for k in unknowns], axis=1)
            out: dict[str, object] = {"u": u, "attrs": {k: f.attrs[k] for k in f.attrs}, **by_unknown(u, unknowns)}
            for a, n in zip(axes, du.shape[1:]):
                if f[a].shape != (n,):
                    raise FieldFileError(f"{path}: coordinate {a} has shape {f[a].shape}, expected ({n},)")
                out[a] = f[a][()]
            for name in f:
                if name in out or not isinstance(f[name], h5py.Dataset):
                    continue
                d = f[name]
                if d.shape[:1] == du.shape[:1] and d.size <= max_elements:
                    out[name] = d[()]
            return out
    except FieldFileError:
        raise
    except (OSError, KeyError, ValueError) as exc:
        raise FieldFileError(f"{path}: unreadable field file ({exc})") from None
