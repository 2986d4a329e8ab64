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

{{- define "inferencepool.image" -}}
{{- $image := .Values.inferenceExtension.image -}}
{{- printf "%s/%s:%s" $image.hub $image.name ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}
