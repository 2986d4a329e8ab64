{{/* The pool's name is the release name, as in upstream's chart. */}}
{{- define "inferencepool.poolName" -}}
{{- .Release.Name | lower | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the EPP's Deployment, Service, ServiceAccount, Role and RoleBinding. */}}
{{- define "inferencepool.eppName" -}}
{{- printf "%s-epp" (.Release.Name | lower | trunc 59 | trimSuffix "-") -}}
{{- end -}}

{{- define "inferencepool.labels" -}}
app.kubernetes.io/name: inference-epp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "inferencepool.selectorLabels" . }}
{{- end -}}

{{- define "inferencepool.selectorLabels" -}}
inferencepool: {{ include "inferencepool.eppName" . }}
{{- end -}}

{{/* The image: registry/repository:tag (upstream v1.5.0's names; its older hub/name are read too). */}}
{{- define "inferencepool.image" -}}
{{- $image := .Values.inferenceExtension.image -}}
{{- $registry := get $image "hub" | default $image.registry -}}
{{- $repository := get $image "name" | default $image.repository -}}
{{- printf "%s/%s:%s" $registry $repository ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
The pool's API group, from inferencePool.apiVersion: one of the two generations the EPP reads, else
the rendering fails naming both.
*/}}
{{- define "inferencepool.poolGroup" -}}
{{- $apiVersion := .Values.inferencePool.apiVersion -}}
{{- if eq $apiVersion "inference.networking.k8s.io/v1" -}}
inference.networking.k8s.io
{{- else if eq $apiVersion "inference.networking.x-k8s.io/v1alpha2" -}}
inference.networking.x-k8s.io
{{- else -}}
{{- fail (printf "inferencePool.apiVersion %q is not a pool generation the EPP reads: use inference.networking.k8s.io/v1 or inference.networking.x-k8s.io/v1alpha2" $apiVersion) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the pool is v1alpha2 (upstream v0.3.0's CRDs), else empty. */}}
{{- define "inferencepool.isV1alpha2" -}}
{{- if eq (include "inferencepool.poolGroup" .) "inference.networking.x-k8s.io" -}}true{{- end -}}
{{- end -}}

{{/* The v1alpha2 pool's one port: targetPortNumber, else the first of targetPorts. */}}
{{- define "inferencepool.targetPortNumber" -}}
{{- $pool := .Values.inferencePool -}}
{{- if $pool.targetPortNumber -}}
{{- $pool.targetPortNumber -}}
{{- else -}}
{{- if gt (len $pool.targetPorts) 1 -}}
{{- fail "inferencePool.targetPorts: a v1alpha2 pool has one port (targetPortNumber); several ports need inferencePool.apiVersion inference.networking.k8s.io/v1" -}}
{{- end -}}
{{- (first $pool.targetPorts).number -}}
{{- end -}}
{{- end -}}
