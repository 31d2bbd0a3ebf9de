"""kwok stages: how simulated nodes and pods move through their lifecycles (pure data).

Nodes become Ready at once and heartbeat so the node lifecycle controller never evicts. Pods
that the real scheduler bound to a node get an IP, start and become Ready; what happens next is
chosen per pod (so per test) with annotations, the way a real workload would behave:

=============================================  ==============================================
``stage.agentrl.dev/outcome`` (unset)          the pod stays Running and Ready
``stage.agentrl.dev/outcome: Succeeded``       containers exit 0, phase Succeeded
``stage.agentrl.dev/outcome: Failed``          containers exit 1 (reason Error), phase Failed
``stage.agentrl.dev/outcome: CrashLoop``       Running but not Ready, CrashLoopBackOff waiting
``stage.agentrl.dev/outcome: ImagePullError``  Pending, ImagePullBackOff waiting
``stage.agentrl.dev/after``                    delay before the outcome (Go duration, "2s")
``stage.agentrl.dev/start-after``              delay before the pod starts (default 200ms)
=============================================  ==============================================

A deleted pod that still carries finalizers (a Job's ``batch.kubernetes.io/job-tracking``) is
stopped first, as a kubelet stops its containers (exit 143, phase Failed), so the controller
that owns the finalizer can account for it and remove it; then deleted pods are removed once
their finalizers are gone, as a kubelet would confirm.
"""

from __future__ import annotations

OUTCOME = "stage.agentrl.dev/outcome"
AFTER = "stage.agentrl.dev/after"
START_AFTER = "stage.agentrl.dev/start-after"

_NOT_DELETED = """\
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'"""


def _terminated(exit_code: int, reason: str, phase: str) -> str:
    return f"""\
    statusTemplate: |
      {{{{ $now := Now }}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {exit_code}
            reason: {reason}
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Ready
        reason: PodCompleted
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: ContainersReady
        reason: PodCompleted
      phase: {phase}"""


def _outcome_stage(name: str, outcome: str, next_block: str, phase_in: str, extra: str = "") -> str:
    return f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{_NOT_DELETED}
    - key: '.status.phase'
      operator: 'In'
      values: ['{phase_in}']
    - key: '.metadata.annotations["{OUTCOME}"]'
      operator: 'In'
      values: ['{outcome}']
{extra}  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["{AFTER}"]'
  next:
{next_block}
"""


NODE_STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrl-node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ .metadata.name | Quote }}
        type: Hostname
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ NodePort }}
      allocatable:
      {{ YAML .status.allocatable 1 }}
      capacity:
      {{ YAML .status.capacity 1 }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
        kernelVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
        osImage: agentrl-simulated
        machineID: ""
        bootID: ""
        systemUUID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrl-node-heartbeat
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: 15000
    jitterDurationMilliseconds: 20000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
  immediateNextStage: false
"""


def _started_conditions(*, ready: bool) -> str:
    """The conditions of a pod whose containers were created (Ready as given)."""
    status = "True" if ready else "False"
    reason = "" if ready else "        reason: ContainersNotReady\n"
    return (
        "      - lastTransitionTime: {{ $now | Quote }}\n"
        '        status: "True"\n'
        "        type: Initialized\n"
        "      - lastTransitionTime: {{ $now | Quote }}\n"
        '        status: "True"\n'
        "        type: PodReadyToStartContainers\n"
        + "".join(
            "      - lastTransitionTime: {{ $now | Quote }}\n"
            f'        status: "{status}"\n{reason}        type: {kind}\n'
            for kind in ("Ready", "ContainersReady")
        )
    )


POD_START_STAGES = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrl-pod-create
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{_NOT_DELETED}
    - key: '.spec.nodeName'
      operator: 'Exists'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
  delay:
    durationMilliseconds: 0
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
{_started_conditions(ready=False)}      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: ContainerCreating
      {{{{ end }}}}
      hostIP: {{{{ NodeIPWith .spec.nodeName | Quote }}}}
      podIP: {{{{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}}}
      phase: Pending
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrl-pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{_NOT_DELETED}
    - key: '.status.podIP'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.metadata.annotations["{OUTCOME}"]'
      operator: 'NotIn'
      values: ['ImagePullError']
  delay:
    durationMilliseconds: 200
    durationFrom:
      expressionFrom: '.metadata.annotations["{START_AFTER}"]'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
{_started_conditions(ready=True)}      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
"""

_CRASH_LOOP = """\
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 5
        started: false
        lastState:
          terminated:
            exitCode: 1
            reason: Error
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
        state:
          waiting:
            reason: CrashLoopBackOff
            message: back-off 5m0s restarting failed container
      {{ end }}"""

_IMAGE_PULL = """\
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: ImagePullBackOff
            message: {{ printf "Back-off pulling image %q" .image | Quote }}
      {{ end }}
      phase: Pending"""

POD_OUTCOME_STAGES = "---\n".join(
    [
        _outcome_stage(
            "agentrl-pod-succeed", "Succeeded", _terminated(0, "Completed", "Succeeded"), "Running"
        ),
        _outcome_stage("agentrl-pod-fail", "Failed", _terminated(1, "Error", "Failed"), "Running"),
        _outcome_stage(
            "agentrl-pod-crashloop",
            "CrashLoop",
            _CRASH_LOOP,
            "Running",
            # once in CrashLoopBackOff the pod no longer matches: no re-application loop
            extra="    - key: '.status.containerStatuses.[].state.waiting.reason'\n"
            "      operator: 'NotIn'\n      values: ['CrashLoopBackOff']\n",
        ),
        _outcome_stage(
            "agentrl-pod-image-pull",
            "ImagePullError",
            _IMAGE_PULL,
            "Pending",
            extra="    - key: '.status.podIP'\n      operator: 'Exists'\n"
            "    - key: '.status.containerStatuses.[].state.waiting.reason'\n"
            "      operator: 'NotIn'\n      values: ['ImagePullBackOff']\n",
        ),
    ]
)

POD_STOP_ON_DELETE_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrl-pod-stop-on-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending', 'Running']
  delay:
    durationMilliseconds: 0
  next:
{_terminated(143, "Error", "Failed")}
"""

POD_DELETE_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrl-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  delay:
    durationMilliseconds: 0
  next:
    delete: true
"""


def stages_yaml() -> str:
    """Every stage, as the multi-document YAML kwok reads with ``--config``."""
    return "---\n".join(
        [
            NODE_STAGES,
            POD_START_STAGES,
            POD_OUTCOME_STAGES,
            POD_STOP_ON_DELETE_STAGE,
            POD_DELETE_STAGE,
        ]
    )
