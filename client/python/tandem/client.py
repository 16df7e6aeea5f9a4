"""A client for a tandem server: tandem.v1.Inference over gRPC.

    from tandem import Client
    with Client() as client:  # default_target(), or Client("unix:/path.sock") / Client("host:port")
        generation = client.generate("The licensee may", max_tokens=32, temperature=0)
        for token in generation:
            print(token.text, end="", flush=True)
        print(generation.finish_reason, generation.usage.tokens_per_s)

Arguments left as None take the server's defaults (those of
protos/tandem/v1/inference.proto). Every failed call raises TandemError with
the server's gRPC status code and message.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import pwd
import socket
import stat
from typing import Callable, Iterator, Mapping, Optional, Sequence

import grpc

from tandem.v1 import inference_pb2, inference_pb2_grpc

_FINISH_REASONS = {
    inference_pb2.FINISH_REASON_UNSPECIFIED: "unspecified",
    inference_pb2.FINISH_REASON_EOS: "eos",
    inference_pb2.FINISH_REASON_STOP_ID: "stop_id",
    inference_pb2.FINISH_REASON_STOP_STRING: "stop_string",
    inference_pb2.FINISH_REASON_MAX_TOKENS: "max_tokens",
}


def default_target() -> str:
    """Where tandem-server listens unless told otherwise: unix:<runtime dir>/server.sock,
    the runtime dir being $TANDEM_RUNTIME_DIR, else ${XDG_RUNTIME_DIR:-/tmp}/tandem-<user>
    (common/runtime_dir.h, deploy/tandem-launch.sh)."""
    runtime_dir = os.environ.get("TANDEM_RUNTIME_DIR")
    if not runtime_dir:
        runtime_dir = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp",
                                   f"tandem-{pwd.getpwuid(os.getuid()).pw_name}")
    return f"unix:{runtime_dir}/server.sock"


class TandemError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `message` the server's words."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _error(e: grpc.RpcError) -> TandemError:
    return TandemError(e.code(), e.details() or "")


@dataclasses.dataclass(frozen=True)
class TopLogprob:
    id: int
    text: str
    logprob: float


@dataclasses.dataclass(frozen=True)
class Token:
    id: int
    # The text this token adds; may be empty while text that could begin a
    # stop string is held back (a later token then carries it).
    text: str
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()  # highest first


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    generated_tokens: int
    queue_ms: float
    time_to_first_token_ms: float
    mean_inter_token_ms: float
    p50_inter_token_ms: float
    p99_inter_token_ms: float
    tokens_per_s: float
    total_ms: float


@dataclasses.dataclass(frozen=True)
class BeamSequence:
    ids: list[int]  # generated ids, without the prompt
    text: str
    score: float  # length-penalised
    sum_logprob: float
    finish_reason: str


@dataclasses.dataclass(frozen=True)
class BeamProgress:
    step: int
    live_beams: int
    finished: int
    best: BeamSequence  # the best live beam so far


def _token(t: inference_pb2.Token) -> Token:
    return Token(t.id, t.text, t.logprob, tuple(TopLogprob(lp.id, lp.text, lp.logprob) for lp in t.top_logprobs))


def _usage(u: inference_pb2.Usage) -> Usage:
    return Usage(**{f.name: getattr(u, f.name) for f in dataclasses.fields(Usage)})


def _sequence(s: inference_pb2.BeamSequence) -> BeamSequence:
    return BeamSequence(list(s.ids), s.text, s.score, s.sum_logprob, _FINISH_REASONS.get(s.finish_reason, "unspecified"))


def _request(message_type, **fields):
    """A request with only the fields given (None: unset, the server's default)."""
    return message_type(**{k: v for k, v in fields.items() if v is not None})


class Generation:
    """One generation in flight. Iterate it for the tokens as they arrive;
    afterwards (or after wait()) `tokens`, `ids`, `text`, `finish_reason`,
    `usage` and `seed` describe the whole. As a context manager it cancels a
    generation left unfinished."""

    def __init__(self, call):
        self._call = call
        self._tokens_iter = self._read()
        self.tokens: list[Token] = []
        self.finish_reason: Optional[str] = None  # "eos" | "stop_id" | "stop_string" | "max_tokens"
        self.usage: Optional[Usage] = None
        self.seed: Optional[int] = None

    def _read(self) -> Iterator[Token]:
        try:
            for response in self._call:
                for t in response.tokens:
                    token = _token(t)
                    self.tokens.append(token)
                    yield token
                if response.done:
                    self.finish_reason = _FINISH_REASONS.get(response.finish_reason, "unspecified")
                    self.usage = _usage(response.usage)
                    self.seed = response.seed
        except grpc.RpcError as e:
            raise _error(e) from None
        if self.finish_reason is None:
            raise TandemError(grpc.StatusCode.UNAVAILABLE, "the server ended the stream without its final message")

    def __iter__(self) -> Iterator[Token]:
        return self._tokens_iter

    def wait(self) -> "Generation":
        """Reads the generation to its end; returns self."""
        for _ in self._tokens_iter:
            pass
        return self

    def cancel(self) -> None:
        """Asks the server to stop; iterating further raises TandemError(CANCELLED)."""
        self._call.cancel()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)

    def __enter__(self) -> "Generation":
        return self

    def __exit__(self, *exc) -> None:
        if not self.done:
            self.cancel()


class Client:
    """A connection to one tandem server (one gRPC channel); safe to share
    between threads.

    target: "unix:/path/to/server.sock" or "host:port" (None: default_target()). The constructor waits
    up to connect_timeout seconds for the server and raises TandemError
    (UNAVAILABLE) naming the target otherwise. Every call has a deadline: its
    `timeout` argument in seconds, else call_timeout (tokenize, info, stats)
    or generate_timeout (generate, beam_search).
    """

    def __init__(self, target: Optional[str] = None, *, connect_timeout: float = 10.0, call_timeout: float = 30.0,
                 generate_timeout: float = 3600.0):
        target = target or default_target()
        self.target = target
        self._call_timeout = _positive_timeout(call_timeout, "call_timeout")
        self._generate_timeout = _positive_timeout(generate_timeout, "generate_timeout")
        connect_timeout = _positive_timeout(connect_timeout, "connect_timeout")
        _check_unix_target(target)
        # A server that is starting or restarting is found within a tenth of a second,
        # not after gRPC's default reconnect backoff (1 s, growing to 120 s).
        self._channel = grpc.insecure_channel(target, options=[("grpc.initial_reconnect_backoff_ms", 100),
                                                               ("grpc.min_reconnect_backoff_ms", 100),
                                                               ("grpc.max_reconnect_backoff_ms", 2000)])
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise TandemError(grpc.StatusCode.UNAVAILABLE,
                              f"cannot connect to tandem server at {target} within {connect_timeout:g} s: "
                              f"{_connect_hint(target)}") from None
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompt: Optional[str] = None, *, prompt_ids: Optional[Sequence[int]] = None,
                 add_bos: Optional[bool] = None, max_tokens: Optional[int] = None,
                 temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 min_p: Optional[float] = None, repetition_penalty: Optional[float] = None,
                 seed: Optional[int] = None, stop: Sequence[str] = (), stop_ids: Sequence[int] = (),
                 ignore_eos: bool = False, logprobs: int = 0, logit_bias: Optional[Mapping[int, float]] = None,
                 timeout: Optional[float] = None) -> Generation:
        """Starts a generation from a text prompt or prompt_ids (exactly one);
        iterate the result for its tokens. temperature=0 is greedy. Sampling
        arguments left as None take the model's generation_config.json
        values, then the server's defaults. logit_bias maps token ids to a
        bias in [-100, 100] added to their logits (OpenAI's)."""
        request = _request(inference_pb2.GenerateRequest, prompt=prompt, prompt_ids=prompt_ids, add_bos=add_bos,
                           max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repetition_penalty, seed=seed, stop=list(stop),
                           stop_ids=list(stop_ids), ignore_eos=ignore_eos, logprobs=logprobs,
                           logit_bias=None if logit_bias is None else dict(logit_bias))
        return Generation(self._stub.Generate(request, timeout=self._timeout(timeout, self._generate_timeout)))

    def beam_search(self, prompt: Optional[str] = None, *, prompt_ids: Optional[Sequence[int]] = None,
                    add_bos: Optional[bool] = None, beam_width: int = 4, max_tokens: Optional[int] = None,
                    length_penalty: Optional[float] = None, early_stopping: bool = False,
                    num_return_sequences: Optional[int] = None, stop_ids: Sequence[int] = (),
                    ignore_eos: bool = False, on_progress: Optional[Callable[[BeamProgress], None]] = None,
                    logit_bias: Optional[Mapping[int, float]] = None,
                    timeout: Optional[float] = None) -> list[BeamSequence]:
        """The best sequences, best first. on_progress, if given, sees every step.
        logit_bias as generate()'s, added to every beam's logits."""
        request = _request(inference_pb2.BeamSearchRequest, prompt=prompt, prompt_ids=prompt_ids, add_bos=add_bos,
                           beam_width=beam_width, max_tokens=max_tokens, length_penalty=length_penalty,
                           early_stopping=early_stopping, num_return_sequences=num_return_sequences,
                           stop_ids=list(stop_ids), ignore_eos=ignore_eos, stream_progress=on_progress is not None,
                           logit_bias=None if logit_bias is None else dict(logit_bias))
        sequences = None
        try:
            for response in self._stub.BeamSearch(request, timeout=self._timeout(timeout, self._generate_timeout)):
                if on_progress is not None and response.HasField("progress"):
                    p = response.progress
                    on_progress(BeamProgress(p.step, p.live_beams, p.finished, _sequence(p.best)))
                if response.done:
                    sequences = [_sequence(s) for s in response.sequences]
        except grpc.RpcError as e:
            raise _error(e) from None
        if sequences is None:
            raise TandemError(grpc.StatusCode.UNAVAILABLE, "the server ended the stream without its final message")
        return sequences

    def tokenize(self, text: str, *, add_bos: Optional[bool] = None, timeout: Optional[float] = None) -> list[int]:
        request = _request(inference_pb2.TokenizeRequest, text=text, add_bos=add_bos)
        return list(self._unary(self._stub.Tokenize, request, timeout).ids)

    def detokenize(self, ids: Sequence[int], *, timeout: Optional[float] = None) -> str:
        return self._unary(self._stub.Detokenize, inference_pb2.DetokenizeRequest(ids=list(ids)), timeout).text

    def info(self, *, timeout: Optional[float] = None) -> inference_pb2.ModelInfo:
        """The model and server settings (a tandem.v1.ModelInfo message)."""
        return self._unary(self._stub.GetModelInfo, inference_pb2.GetModelInfoRequest(), timeout)

    def stats(self, *, timeout: Optional[float] = None) -> inference_pb2.ServerStats:
        """Throughput, queue, KV cache and per-layer figures (a tandem.v1.ServerStats message)."""
        return self._unary(self._stub.GetStats, inference_pb2.GetStatsRequest(), timeout)

    @staticmethod
    def _timeout(timeout: Optional[float], default: float) -> float:
        # None is "the default"; 0 is not (it used to mean 3600 s by way of `or`).
        return default if timeout is None else _positive_timeout(timeout, "timeout")

    def _unary(self, method, request, timeout: Optional[float]):
        timeout = self._timeout(timeout, self._call_timeout)
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise _error(e) from None


def _positive_timeout(value, name: str) -> float:
    """A timeout in seconds must be a finite number > 0: 0 or less would expire at
    once, and None means the default only where the signature says so."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _unix_path(target: str) -> Optional[str]:
    if not target.startswith("unix:"):
        return None
    return target[len("unix://"):] if target.startswith("unix://") else target[len("unix:"):]


def _trusted_uid(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _check_unix_target(target: str) -> None:
    """Prompts go to a unix socket only when it and its folder belong to this user
    (or root) and no one else may replace it: another user's socket where the
    server's should be would receive them. Raises TandemError(PERMISSION_DENIED)."""
    if target.startswith("unix-abstract:"):
        raise TandemError(grpc.StatusCode.PERMISSION_DENIED,
                          f"{target}: abstract unix sockets have no owner to check; tandem-server never listens on one")
    path = _unix_path(target)
    if path is None:
        return
    if not path or path.startswith("@"):
        raise TandemError(grpc.StatusCode.PERMISSION_DENIED,
                          f"{target}: no socket path (an abstract socket has no owner to check)")
    try:
        st = os.stat(path)
    except OSError:
        return  # absent: the connection fails and says so
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and not _trusted_uid(link.st_uid):
        raise TandemError(grpc.StatusCode.PERMISSION_DENIED,
                          f"{path} is a symlink of uid {link.st_uid}: refusing to send requests through another "
                          "user's link")
    if not stat.S_ISSOCK(st.st_mode):
        raise TandemError(grpc.StatusCode.FAILED_PRECONDITION, f"{path} is not a socket: not a tandem server address")
    if not _trusted_uid(st.st_uid):
        raise TandemError(grpc.StatusCode.PERMISSION_DENIED,
                          f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or root: refusing "
                          "to send requests to another user's socket (it may be posing as tandem-server)")
    parent = os.path.dirname(path) or "."
    d = os.stat(parent)
    others_write = d.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not d.st_mode & stat.S_ISVTX
    if not _trusted_uid(d.st_uid) or others_write:
        raise TandemError(grpc.StatusCode.PERMISSION_DENIED,
                          f"{path} lies in {parent} (uid {d.st_uid}, mode {stat.S_IMODE(d.st_mode):04o}), which "
                          "another user may write to: the socket could be replaced; refusing to send requests there")


def _connect_hint(target: str) -> str:
    """Why a connection failed, from a connect() of our own: absent, not ours to
    open, stale, or slow."""
    path = _unix_path(target)
    if path is None:
        return "is tandem-server running and listening there?"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        err = probe.connect_ex(path)
    except OSError as e:
        err = e.errno
    finally:
        probe.close()
    if err == errno.ENOENT:
        return f"no socket at {path}: is tandem-server running?"
    if err in (errno.EACCES, errno.EPERM):
        try:
            st = os.stat(path)
            return (f"permission denied opening {path} (owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; "
                    f"you are uid {os.geteuid()}): the server runs as another user, whose socket only they may use")
        except OSError:
            return f"permission denied reaching {path}: a folder on the way is not yours to enter"
    if err == errno.ECONNREFUSED:
        return f"{path} exists but nothing listens on it: the socket of a server that has exited (restart tandem-server)"
    if err in (0, errno.EAGAIN, errno.EINPROGRESS):
        return f"{path} accepts connections but did not answer in time: is tandem-server still starting?"
    return f"cannot connect to {path}: {os.strerror(err)}"
