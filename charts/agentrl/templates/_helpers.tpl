{{/*
Names, labels and images shared by every template.
*/}}

{{- define "agentrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>", or just the release name when it already contains the chart name. */}}
{{- define "agentrl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agentrl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: never change between releases (a Deployment's selector is immutable). */}}
{{- define "agentrl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "agentrl.labels" -}}
helm.sh/chart: {{ include "agentrl.chart" . }}
{{ include "agentrl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrl
{{- end -}}

{{- define "agentrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentrl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag (tag defaulting to appVersion) or repository@digest. */}}
{{- define "agentrl.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The PriorityClass of one kind of pod (operator, trainer, engines, rollout, sandboxes): its name, or
"<fullname>-<kind>" when the chart creates the classes and no name is given; empty: none. */}}
{{- define "agentrl.priorityClassName" -}}
{{- $kind := index . 0 -}}
{{- $root := index . 1 -}}
{{- $class := index $root.Values.priorityClasses $kind -}}
{{- if $class.name -}}
{{- $class.name -}}
{{- else if $root.Values.priorityClasses.create -}}
{{- printf "%s-%s" (include "agentrl.fullname" $root) $kind -}}
{{- end -}}
{{- end -}}

{{/* Whether the operator watches every namespace (a ClusterRole) or only the listed ones. */}}
{{- define "agentrl.clusterWide" -}}
{{- if not .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}
