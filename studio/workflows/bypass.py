"""Bypassed nodes (`"bypass": true` on a node): the workflow as it runs without them.

A bypassed node passes through, as in ComfyUI. Each link from its output to an input X is
replaced by a link from the source of the bypassed node's first input (in its type's input
order) whose source X takes (`ports.accepts`): a bypassed Upscale hands on the picture it gets, a
bypassed LoRA the chain before it, a bypassed second-stage Sampler the first stage's images. With
no such input, X is left unlinked (a required X is then reported by the compiler, which names the
bypassed node). Chains of bypassed nodes resolve through; the links into a bypassed node go with it.

    runnable = without_bypassed(workflow)   # what the compiler checks and expands

Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

from dataclasses import replace

from studio.workflows.format import Endpoint, Link, Workflow, output_type
from studio.workflows.nodes import NODE_TYPES
from studio.workflows.ports import accepts


def without_bypassed(workflow: Workflow) -> Workflow:
    """`workflow` without its bypassed nodes, their outputs' links fed through (the same workflow
    when no node is bypassed)."""
    bypassed = {node_id for node_id, node in workflow.nodes.items() if node.bypass}
    if not bypassed:
        return workflow
    feeding = {(link.target.node, link.target.port): link.source for link in workflow.links}

    def passed_through(node_id: str, wanted: str, seen: frozenset[str]) -> Endpoint | None:
        """What bypassed node `node_id` hands an input of type `wanted`: the first of its inputs'
        sources (resolved through bypassed ones) that such an input takes; None if none does."""
        if node_id in seen:  # a cycle: the compiler reports it on the workflow as sent
            return None
        for port in NODE_TYPES[workflow.nodes[node_id].type].inputs:
            source = feeding.get((node_id, port.name))
            found = None if source is None else resolved(source, wanted, seen | {node_id})
            if found is not None:
                return found
        return None

    def resolved(source: Endpoint, wanted: str, seen: frozenset[str]) -> Endpoint | None:
        if source.node in bypassed:
            return passed_through(source.node, wanted, seen)
        return source if accepts(wanted, output_type(workflow.nodes[source.node], source.port)) else None

    links = []
    for link in workflow.links:
        if link.target.node in bypassed:
            continue
        target = workflow.nodes[link.target.node]
        wanted = NODE_TYPES[target.type].input(link.target.port).type
        source = link.source if link.source.node not in bypassed else passed_through(link.source.node, wanted, frozenset())
        if source is not None:
            links.append(Link(source, link.target))
    nodes = {node_id: node for node_id, node in workflow.nodes.items() if node_id not in bypassed}
    return replace(workflow, nodes=nodes, links=tuple(links))
