{{/* The name of every object: the release name with "-histd". */}}
{{- define "histd.fullname" -}}
{{ printf "%s-histd" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "histd.selectorLabels" -}}
app.kubernetes.io/name: histd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "histd.labels" -}}
{{ include "histd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "histd.secretName" -}}
{{- if .Values.secret.create -}}
{{ include "histd.fullname" . }}
{{- else -}}
{{ required "secret.existingSecret is required when secret.create is false" .Values.secret.existingSecret }}
{{- end -}}
{{- end }}
