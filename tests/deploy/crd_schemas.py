"""JSON Schemas for the two prometheus-operator resources (monitoring.coreos.com/v1), which kubernetes-validate does
not know. A subset of the operator's CRDs, written here: the fields these manifests use and their neighbours, with
unknown fields rejected so that a typo fails. Durations use the CRD's own pattern."""

from __future__ import annotations

from typing import Any

DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                   "namespace": {"type": "string"}, "labels": _STRING_MAP, "annotations": _STRING_MAP},
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                           "values": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False}},
    },
    "additionalProperties": False,
}


def _resource(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
                       "metadata": _METADATA, "spec": spec},
        "additionalProperties": False,
    }


SERVICE_MONITOR = _resource("ServiceMonitor", {
    "type": "object",
    "required": ["selector", "endpoints"],
    "properties": {
        "selector": _LABEL_SELECTOR,
        "namespaceSelector": {"type": "object", "properties": {
            "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False},
        "jobLabel": {"type": "string"},
        "targetLabels": {"type": "array", "items": {"type": "string"}},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {
                "port": {"type": "string"}, "targetPort": {"type": ["integer", "string"]},
                "path": {"type": "string", "pattern": "^/"}, "scheme": {"enum": ["http", "https"]},
                "interval": {"type": "string", "pattern": DURATION},
                "scrapeTimeout": {"type": "string", "pattern": DURATION},
                "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
                "relabelings": {"type": "array", "items": {"type": "object"}},
                "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                "params": {"type": "object"},
                # SafeAuthorization: the Authorization header's type (default Bearer) and credentials from a Secret.
                "authorization": {"type": "object", "properties": {
                    "type": {"type": "string"},
                    "credentials": {"type": "object", "required": ["key"], "properties": {
                        "name": {"type": "string"}, "key": {"type": "string"}, "optional": {"type": "boolean"}},
                        "additionalProperties": False}},
                    "additionalProperties": False},
            },
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
})

PROMETHEUS_RULE = _resource("PrometheusRule", {
    "type": "object",
    "required": ["groups"],
    "properties": {"groups": {"type": "array", "items": {
        "type": "object",
        "required": ["name", "rules"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "interval": {"type": "string", "pattern": DURATION},
            "limit": {"type": "integer"},
            "partial_response_strategy": {"type": "string"},
            "rules": {"type": "array", "items": {
                "type": "object",
                "required": ["expr"],
                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                "properties": {
                    "alert": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                    "record": {"type": "string"},
                    "expr": {"type": ["string", "integer"]},
                    "for": {"type": "string", "pattern": DURATION},
                    "keep_firing_for": {"type": "string", "pattern": DURATION},
                    "labels": _STRING_MAP,
                    "annotations": _STRING_MAP,
                },
                "additionalProperties": False,
            }},
        },
        "additionalProperties": False,
    }}},
    "additionalProperties": False,
})

SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
           ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE}
