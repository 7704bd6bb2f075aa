"""A checkpoint's state as data: JSON for its structure, safetensors for its arrays, and no pickle.

:func:`encode` walks an object graph and returns JSON-ready values and the arrays it met. Plain JSON values stay as
they are (floats through Python's ``repr``, so they read back bit for bit; NaN and infinities as JSON's common
extensions). Everything else becomes a tagged object ``{"$": tag, ...}``:

- ``tuple``, ``set``, ``frozenset``, ``deque`` (with its ``maxlen``), ``dict`` (its items, for keys that are not
  strings), ``Counter``, ``defaultdict`` (its factory one of :data:`FACTORIES`);
- ``np``: a numpy scalar (its dtype and value); ``array`` / ``tensor``: a numpy array or a torch tensor, stored
  under a key in the arrays file (a tensor with its device);
- ``generator``: a numpy ``Generator`` (its bit generator's state);
- ``object``: an instance of one of the classes a state may hold (:func:`state_classes`, by their class names:
  a module move does not change the format), its fields by name; a ``NamedTuple`` by position;
- ``ref``: the n-th mutable value met before, so that values shared by two holders stay shared.

:func:`decode` reverses it with fixed tables: it never imports a module or looks a class up by a stored path, so
reading a checkpoint cannot run code that the checkpoint names.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import torch

# The modules whose classes a checkpoint's state may hold: the scheduling core, the records, the executor's step.
STATE_MODULES = (
    "oppo.core.async_queue",
    "oppo.core.buffer",
    "oppo.core.chunking",
    "oppo.core.config",
    "oppo.core.overcommit",
    "oppo.core.policies",
    "oppo.core.scheduler",
    "oppo.records.schema",
    "oppo.exec.step.runner",
    "oppo.exec.step.snapshot",
)
FACTORIES: dict[str, Callable[[], Any]] = {"list": list, "int": int, "float": float, "set": set, "dict": dict}
ATOMS = (type(None), bool, int, float, str)
SCALAR_KINDS = "biufc"  # numpy scalars a state holds: booleans, integers, floats, complex
DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps")
BIT_GENERATORS = {g.__name__: g for g in (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)}


@cache
def state_classes() -> dict[str, type]:
    """Class name -> class, for every class defined in :data:`STATE_MODULES` (names are unique across them)."""
    found: dict[str, type] = {}
    for name in STATE_MODULES:
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if inspect.isclass(cls) and cls.__module__ == name:
                if cls_name in found and found[cls_name] is not cls:
                    raise RuntimeError(f"two state classes named {cls_name}: {found[cls_name]} and {cls}")
                found[cls_name] = cls
    return found


class Encoder:
    """One encoding: the arrays met so far (key -> tensor) and the mutable values already written (by identity)."""

    def __init__(self) -> None:
        self.arrays: dict[str, torch.Tensor] = {}
        self._seen: dict[int, int] = {}  # id(value) -> its reference number
        self._alive: list[Any] = []  # keeps each referenced value alive, so that its id is not reused

    def __call__(self, value: Any) -> Any:
        kind = type(value)
        if kind in ATOMS:
            return value
        ref = self._seen.get(id(value))
        if ref is not None:
            return {"$": "ref", "n": ref}
        if kind is tuple:
            return {"$": "tuple", "items": [self(v) for v in value]}
        if isinstance(value, np.generic):
            return {"$": "np", "dtype": value.dtype.str, "value": value.item()}
        if kind is frozenset:
            return {"$": "frozenset", "items": [self(v) for v in value]}
        number = self._remember(value)
        if kind is list:
            return {"$": "list", "n": number, "items": [self(v) for v in value]}
        if kind is dict:
            return {"$": "dict", "n": number, "items": [[self(k), self(v)] for k, v in value.items()]}
        if kind is set:
            return {"$": "set", "n": number, "items": [self(v) for v in value]}
        if kind is collections.deque:
            return {"$": "deque", "n": number, "maxlen": value.maxlen, "items": [self(v) for v in value]}
        if kind is collections.Counter:
            return {"$": "Counter", "n": number, "items": [[self(k), self(v)] for k, v in value.items()]}
        if kind is collections.defaultdict:
            return self._defaultdict(value, number)
        if isinstance(value, np.ndarray | torch.Tensor):
            return self._array(value, number)
        if kind is np.random.Generator:
            return {"$": "generator", "n": number, "state": self(value.bit_generator.state)}
        return self._object(value, number)

    def _remember(self, value: Any) -> int:
        number = len(self._alive)
        self._seen[id(value)] = number
        self._alive.append(value)
        return number

    def _defaultdict(self, value: collections.defaultdict, number: int) -> dict:
        factory = next((name for name, f in FACTORIES.items() if f is value.default_factory), None)
        if factory is None:
            raise TypeError(f"a defaultdict whose factory is {value.default_factory!r} cannot be stored")
        return {
            "$": "defaultdict",
            "n": number,
            "factory": factory,
            "items": [[self(k), self(v)] for k, v in value.items()],
        }

    def _array(self, value: np.ndarray | torch.Tensor, number: int) -> dict:
        key = str(len(self.arrays))
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise TypeError("an array of Python objects cannot be stored")
            self.arrays[key] = torch.from_numpy(np.ascontiguousarray(value)).clone()
            return {"$": "array", "n": number, "key": key}
        self.arrays[key] = value.detach().to("cpu", copy=True).contiguous()
        return {"$": "tensor", "n": number, "key": key, "device": str(value.device), "grad": value.requires_grad}

    def _object(self, value: Any, number: int) -> dict:
        name = type(value).__name__
        if state_classes().get(name) is not type(value):
            raise TypeError(f"{type(value).__module__}.{type(value).__qualname__} is not a class a state may hold")
        if isinstance(value, tuple):  # a NamedTuple: by position
            return {"$": "object", "n": number, "class": name, "items": [self(v) for v in value]}
        fields = dict(getattr(value, "__dict__", {}))
        for slot in _slots(type(value)):
            if hasattr(value, slot):
                fields[slot] = getattr(value, slot)
        return {"$": "object", "n": number, "class": name, "fields": {k: self(v) for k, v in fields.items()}}


def _slots(cls: type) -> list[str]:
    return [s for klass in cls.__mro__ for s in getattr(klass, "__slots__", ()) if s not in ("__dict__", "__weakref__")]


def encode(value: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``value`` as JSON-ready data and the arrays it holds (key -> tensor, for a safetensors file)."""
    encoder = Encoder()
    return encoder(value), encoder.arrays


def decode(data: Any, arrays: dict[str, torch.Tensor]) -> Any:
    """The value :func:`encode` gave ``data`` and ``arrays`` for; ``ValueError`` for anything it would not write
    (a value out of its type's range, a missing field, nesting deeper than the interpreter's stack included)."""
    try:
        return Decoder(arrays)(data)
    except (OverflowError, KeyError, IndexError, AssertionError, RecursionError, MemoryError) as err:
        raise ValueError(f"a state value that cannot be one ({type(err).__name__}: {err})") from None


class Decoder:
    def __init__(self, arrays: dict[str, torch.Tensor]) -> None:
        self.arrays = arrays
        self.refs: dict[int, Any] = {}

    def __call__(self, data: Any) -> Any:
        if type(data) in ATOMS:
            return data
        if type(data) is list:  # encode writes lists tagged; a bare one is from elsewhere
            raise ValueError("a bare list where the state holds tagged values")
        if type(data) is not dict or not isinstance(data.get("$"), str):
            raise ValueError(f"an untagged value of type {type(data).__name__}")
        tag = data["$"]
        method = getattr(self, f"_{tag}", None)
        if tag.startswith("_") or method is None:
            raise ValueError(f"unknown tag {tag!r}")
        return method(data)

    def _keep(self, data: dict, value: Any) -> Any:
        number = data.get("n")
        if type(number) is not int or number in self.refs:
            raise ValueError(f"a {data['$']} without a new reference number")
        self.refs[number] = value
        return value

    def _items(self, data: dict) -> list:
        items = data.get("items")
        if type(items) is not list:
            raise ValueError(f"a {data['$']} without its items")
        return items

    def _pairs(self, data: dict):
        for pair in self._items(data):
            if type(pair) is not list or len(pair) != 2:
                raise ValueError(f"a {data['$']} item that is not a pair")
            yield self(pair[0]), self(pair[1])

    def _ref(self, data: dict) -> Any:
        if data.get("n") not in self.refs:
            raise ValueError(f"a reference to no value ({data.get('n')!r})")
        return self.refs[data["n"]]

    def _tuple(self, data: dict) -> tuple:
        return tuple(self(v) for v in self._items(data))

    def _frozenset(self, data: dict) -> frozenset:
        return frozenset(self(v) for v in self._items(data))

    def _np(self, data: dict) -> np.generic:
        try:
            dtype = np.dtype(data["dtype"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"a numpy scalar that is not one: {err}") from None
        if dtype.kind not in SCALAR_KINDS or type(data.get("value")) not in ATOMS:
            raise ValueError(f"a numpy scalar of dtype {dtype} (numbers and booleans only)")
        return dtype.type(data["value"])

    def _list(self, data: dict) -> list:
        out = self._keep(data, [])
        out.extend(self(v) for v in self._items(data))
        return out

    def _dict(self, data: dict) -> dict:
        out = self._keep(data, {})
        out.update(self._pairs(data))
        return out

    def _set(self, data: dict) -> set:
        out = self._keep(data, set())
        out.update(self(v) for v in self._items(data))
        return out

    def _deque(self, data: dict) -> collections.deque:
        maxlen = data.get("maxlen")
        if maxlen is not None and (type(maxlen) is not int or not 0 <= maxlen < 2**31):
            raise ValueError(f"a deque bounded by {maxlen!r}")
        out = self._keep(data, collections.deque(maxlen=maxlen))
        out.extend(self(v) for v in self._items(data))
        return out

    def _Counter(self, data: dict) -> collections.Counter:  # noqa: N802 - the tag is the class's name
        out = self._keep(data, collections.Counter())
        out.update(dict(self._pairs(data)))
        return out

    def _defaultdict(self, data: dict) -> collections.defaultdict:
        factory = FACTORIES.get(data.get("factory"))
        if factory is None:
            raise ValueError(f"unknown defaultdict factory {data.get('factory')!r}")
        out = self._keep(data, collections.defaultdict(factory))
        out.update(self._pairs(data))
        return out

    def _stored(self, data: dict) -> torch.Tensor:
        key = data.get("key")
        if key not in self.arrays:
            raise ValueError(f"array {key!r} is not in the arrays file")
        return self.arrays[key]

    def _array(self, data: dict) -> np.ndarray:
        return self._keep(data, self._stored(data).numpy().copy())

    def _tensor(self, data: dict) -> torch.Tensor:
        device = data.get("device", "cpu")
        if not isinstance(device, str) or not DEVICE.fullmatch(device):
            raise ValueError(f"a tensor on device {device!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"a tensor saved on {device}: this machine has no CUDA device")
        tensor = self._stored(data).clone().to(device)
        return self._keep(data, tensor.requires_grad_(bool(data.get("grad"))))

    def _generator(self, data: dict) -> np.random.Generator:
        state = self(data.get("state"))
        bit_generator = BIT_GENERATORS.get(state.get("bit_generator")) if type(state) is dict else None
        if bit_generator is None:
            raise ValueError("a random generator of an unknown kind")
        generator = np.random.Generator(bit_generator())
        generator.bit_generator.state = state
        return self._keep(data, generator)

    def _object(self, data: dict) -> Any:
        cls = state_classes().get(data.get("class"))
        if cls is None:
            raise ValueError(f"unknown state class {data.get('class')!r}")
        if issubclass(cls, tuple):  # a NamedTuple, by position: its items first (a tuple cannot be filled later)
            return self._keep(data, cls(*(self(v) for v in self._items(data))))
        fields = data.get("fields")
        if type(fields) is not dict:
            raise ValueError(f"a {cls.__name__} without its fields")
        out = self._keep(data, cls.__new__(cls))
        for name, value in fields.items():
            object.__setattr__(out, name, self(value))  # frozen dataclasses too: as unpickling restores them
        return out
