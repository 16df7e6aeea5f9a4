#!/usr/bin/env python3
"""The oracle for tests/chat_template_test.cc: renders chat templates with
jinja2 exactly as transformers' apply_chat_template does.

Usage: chat_template_oracle.py JOBS.json RESULTS.json

JOBS.json is a list of {"id", "template", "messages", "tools", "documents",
"add_generation_prompt", "continue_final_message", "extra_context"}; each
result is {"id", "ok": true, "output"} or {"id", "ok": false, "error_type",
"error"}. The environment is transformers' (_compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, {% generation %} rendering its body, tojson as
json.dumps(ensure_ascii=False), and raise_exception raising TemplateError.
Exit status 3 when jinja2 cannot be imported (the test then skips).
"""
import json
import sys

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # pragma: no cover - reported to the test as a skip
    print(f"jinja2 is not importable: {e}", file=sys.stderr)
    sys.exit(3)


class AssistantTracker(Extension):
    """transformers' {% generation %} block, minus the assistant mask."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def continue_final(rendered, messages):
    """transformers' continue_final_message cut."""
    final_message = messages[-1]["content"]
    if isinstance(final_message, (list, tuple)):
        for content_block in reversed(final_message):
            if "text" in content_block:
                final_message = content_block["text"]
                break
        else:
            raise ValueError("continue_final_message is set but we could not find any text to continue")
    if final_message.strip() not in rendered:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat")
    final_msg_loc = rendered.rindex(final_message.strip())
    if rendered[final_msg_loc:final_msg_loc + len(final_message.lstrip())] == final_message:
        return rendered[:final_msg_loc + len(final_message.lstrip())]
    return rendered[:final_msg_loc + len(final_message.strip())]


def render(env, job):
    template = env.from_string(job["template"])
    kwargs = dict(job.get("extra_context") or {})
    rendered = template.render(messages=job["messages"], tools=job.get("tools"), documents=job.get("documents"),
                               add_generation_prompt=job.get("add_generation_prompt", False), **kwargs)
    if job.get("continue_final_message"):
        rendered = continue_final(rendered, job["messages"])
    return rendered


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    env = make_environment()
    results = []
    for job in jobs:
        try:
            results.append({"id": job["id"], "ok": True, "output": render(env, job)})
        except Exception as e:  # every failure is a result to compare, not a crash
            results.append({"id": job["id"], "ok": False, "error_type": type(e).__name__, "error": str(e)})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "results": results}, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
