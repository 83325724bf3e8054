"""``bundle.json``'s ``ensemble`` section: where an ensemble's members came from, checked when a bundle is read.

:class:`Ensemble` is what ``calibseg-ensemble`` (:mod:`Training.ensemble`) writes: one :class:`EnsembleMember` per
network (its fold, that fold's validation patients, its own temperature, best epoch and weights' checksum) and how the
ensemble's one temperature was fitted; ``python -m Training.sub_ensemble`` keeps some members (:meth:`Ensemble.kept`)
and adds :class:`SelectedFrom`, the ensemble they were kept of. :class:`~CalibSegLib.bundle.BundleMetadata` holds the
section as these frozen objects, so the tools read it by attribute, with the facts they share derived here (a member's
training patients, a sub-ensemble's section). The stored section is untrusted input:
:meth:`Ensemble.from_dict` checks its whole shape and raises :class:`EnsembleError` with a phrase naming the field,
which :class:`~CalibSegLib.bundle.BundleMetadata` makes one :class:`~CalibSegLib.bundle.BundleError` sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Sequence

__all__ = ["MAX_ENSEMBLE_SIZE", "EnsembleError", "EnsembleMember", "SelectedFrom", "Ensemble"]

MAX_ENSEMBLE_SIZE = 16  # networks one bundle holds


class EnsembleError(ValueError):
    """A malformed ``ensemble`` section; the message is a phrase naming the field (the caller ends the sentence)."""


def _is_integer(value: Any) -> bool:
    """An integer, NumPy's included (writers may pass them before the JSON is written), but no bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_temperature(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _described(value: Any) -> str:
    """What was found instead, for the phrase: a list by its length, anything else by its JSON type's name."""
    return f"a list of {len(value)} item(s)" if isinstance(value, list) else type(value).__name__


def _check_fields(values: Any, name: str, required: set[str], optional: frozenset[str] = frozenset()) -> None:
    """``values`` is an object holding every ``required`` field and no field outside ``required | optional``."""
    if not isinstance(values, dict):
        raise EnsembleError(f"{name} must be an object, got {_described(values)}")
    missing, unknown = sorted(required - set(values)), sorted(set(values) - required - optional)
    if missing:
        raise EnsembleError(f"{name} lacks the field(s) {', '.join(missing)}")
    if unknown:
        raise EnsembleError(f"{name} has unknown field(s) {', '.join(unknown)}")


@dataclass(frozen=True)
class EnsembleMember:
    """One network of an ensemble, as its fold left it: ``fold`` (its number in the cross-validation),
    ``validation`` (the patients it never trained on: its out-of-fold patients), ``own_temperature`` (the fold
    network's own, one number or one per class), ``best_epoch`` (None where the run recorded none) and
    ``weights_sha256`` (the fold network's weights' checksum)."""

    fold: int
    validation: tuple[str, ...]
    own_temperature: float | tuple[float, ...]
    best_epoch: int | None
    weights_sha256: str

    @classmethod
    def from_dict(cls, values: Any, name: str) -> "EnsembleMember":
        """Read and check a stored member (``name`` says which in the phrase, e.g. ``members[2]``).

        Raises:
            EnsembleError: not an object, a missing, unknown or malformed field.
        """
        _check_fields(values, name, {"fold", "validation", "own_temperature", "best_epoch", "weights_sha256"})
        if not _is_integer(values["fold"]) or values["fold"] < 0:
            raise EnsembleError(f"{name}'s fold must be an integer >= 0, got {values['fold']!r}")
        validation = values["validation"]
        if not isinstance(validation, list) or not all(map(_is_name, validation)):
            raise EnsembleError(f"{name}'s validation must be a list of patient ids, got {_described(validation)}")
        temperature = values["own_temperature"]
        temperatures = temperature if isinstance(temperature, list) else [temperature]
        if not temperatures or not all(map(_is_temperature, temperatures)):
            raise EnsembleError(f"{name}'s own_temperature must be one positive number or a list of them, got "
                                f"{temperature!r}")
        best_epoch = values["best_epoch"]
        if best_epoch is not None and (not _is_integer(best_epoch) or best_epoch < 0):
            raise EnsembleError(f"{name}'s best_epoch must be an integer >= 0 or null, got {best_epoch!r}")
        if not _is_name(values["weights_sha256"]):
            raise EnsembleError(f"{name}'s weights_sha256 must be its fold network's checksum, got "
                                f"{values['weights_sha256']!r}")
        return cls(values["fold"], tuple(validation),
                   tuple(temperature) if isinstance(temperature, list) else temperature, best_epoch,
                   values["weights_sha256"])

    def training_patients(self, labelled: Sequence[str]) -> list[str]:
        """The patients this member trained on: the ensemble's ``labelled`` ones (its ``data["train"]``: every
        fold's patients) but those of its own fold, in their order."""
        return [patient for patient in labelled if patient not in self.validation]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``, as :meth:`from_dict` read it."""
        temperature = list(self.own_temperature) if isinstance(self.own_temperature, tuple) else self.own_temperature
        return {"fold": self.fold, "validation": list(self.validation), "own_temperature": temperature,
                "best_epoch": self.best_epoch, "weights_sha256": self.weights_sha256}


@dataclass(frozen=True)
class SelectedFrom:
    """A sub-ensemble's origin: the ensemble's file name (``bundle``), its ``weights_sha256`` and the ``members``
    kept, by their numbers there, in this bundle's member order."""

    bundle: str
    weights_sha256: str
    members: tuple[int, ...]

    @classmethod
    def from_dict(cls, values: Any) -> "SelectedFrom":
        """Read and check a stored origin.

        Raises:
            EnsembleError: not an object, a missing, unknown or malformed field, or member numbers that are not at
                least two distinct ones of an ensemble (0 to :data:`MAX_ENSEMBLE_SIZE` - 1).
        """
        _check_fields(values, "selected_from", {"bundle", "weights_sha256", "members"})
        for name in ("bundle", "weights_sha256"):
            if not _is_name(values[name]):
                raise EnsembleError(f"selected_from's {name} must be a non-empty string, got {values[name]!r}")
        members = values["members"]
        if (not isinstance(members, list) or len(members) < 2
                or not all(_is_integer(member) and 0 <= member < MAX_ENSEMBLE_SIZE for member in members)
                or len(set(members)) != len(members)):
            raise EnsembleError(f"selected_from's members must be at least two distinct member numbers 0 to "
                                f"{MAX_ENSEMBLE_SIZE - 1}, got {members!r}")
        return cls(values["bundle"], values["weights_sha256"], tuple(members))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``."""
        return {"bundle": self.bundle, "weights_sha256": self.weights_sha256, "members": list(self.members)}


@dataclass(frozen=True)
class Ensemble:
    """The ``ensemble`` section: one :class:`EnsembleMember` per network, in the order of the weights'
    ``members.<m>.…``; ``temperature``: how the ensemble's one temperature was fitted (a description); and
    ``selected_from``: a sub-ensemble's origin, None for an ensemble of all its folds."""

    members: tuple[EnsembleMember, ...]
    temperature: str
    selected_from: SelectedFrom | None = None

    @classmethod
    def from_dict(cls, values: Any, ensemble_size: int) -> "Ensemble":
        """Read and check a stored section of a bundle of ``ensemble_size`` networks.

        Raises:
            EnsembleError: not an object, a missing, unknown or malformed field, another number of members than
                networks, a fold given twice, or a malformed ``selected_from`` (or one numbering fewer members).
        """
        _check_fields(values, "it", {"members", "temperature"}, frozenset({"selected_from"}))
        stored = values["members"]
        if not isinstance(stored, list) or len(stored) != ensemble_size:
            raise EnsembleError(f"members must list one object per network, {ensemble_size} (its ensemble_size), "
                                f"got {_described(stored)}")
        members = tuple(EnsembleMember.from_dict(member, f"members[{index}]") for index, member in enumerate(stored))
        folds = [member.fold for member in members]
        if len(set(folds)) != len(folds):
            raise EnsembleError(f"members' folds must be distinct, got {', '.join(map(str, folds))}")
        if not isinstance(values["temperature"], str):
            raise EnsembleError(f"temperature must describe how the ensemble's temperature was fitted, got "
                                f"{_described(values['temperature'])}")
        selected_from = values.get("selected_from")
        if selected_from is not None:
            selected_from = SelectedFrom.from_dict(selected_from)
            # Readers take member m's number in the ensemble it came from as selected_from's members[m]: one
            # number per network.
            if len(selected_from.members) != ensemble_size:
                raise EnsembleError(f"selected_from names {len(selected_from.members)} members for "
                                    f"{ensemble_size} networks (its ensemble_size), not one for each")
        return cls(members, values["temperature"], selected_from)

    def kept(self, members: Sequence[int], bundle: str, weights_sha256: str) -> "Ensemble":
        """The section of a sub-ensemble of this one, the bundle ``bundle`` whose weights are ``weights_sha256``:
        the entries of ``members`` (numbers of this ensemble's members, in the order kept), the same temperature's
        description, and ``selected_from`` naming them there."""
        return Ensemble(tuple(self.members[index] for index in members), self.temperature,
                        SelectedFrom(bundle, weights_sha256, tuple(members)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``bundle.json``, as :meth:`from_dict` read it (no ``selected_from`` where None)."""
        origin = {} if self.selected_from is None else {"selected_from": self.selected_from.to_dict()}
        return {"members": [member.to_dict() for member in self.members], "temperature": self.temperature, **origin}
