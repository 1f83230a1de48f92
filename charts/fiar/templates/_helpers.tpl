{{/* Chart name, truncated for DNS names. */}}
{{- define "fiar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix; truncated to 50 so that component suffixes still fit in 63 characters. */}}
{{- define "fiar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else if contains (include "fiar.name" .) .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "fiar.name" .) | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "fiar.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "fiar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "fiar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "fiar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fiar.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fiar.operator.fullname" -}}{{ include "fiar.fullname" . }}-operator{{- end }}
{{- define "fiar.agent.fullname" -}}{{ include "fiar.fullname" . }}-agent{{- end }}
{{- define "fiar.webhook.secretName" -}}{{ include "fiar.fullname" . }}-webhook-tls{{- end }}

{{- define "fiar.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "fiar.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fiar.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "fiar.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: call with (dict "image" .Values.operator.image "ctx" $). */}}
{{- define "fiar.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* The operator's affinity when operator.affinity is empty: spread replicas over nodes when possible. */}}
{{- define "fiar.operator.defaultAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "fiar.selectorLabels" (dict "ctx" . "component" "operator") | nindent 12 }}
{{- end }}

{{/* A component's affinity with the required node affinity to .Values.architectures added (ANDed into
each of its own node selector terms): call with (dict "affinity" .Values.agent.affinity "ctx" $). */}}
{{- define "fiar.affinity" -}}
{{- $aff := deepCopy (.affinity | default dict) }}
{{- $arch := dict "key" "kubernetes.io/arch" "operator" "In" "values" .ctx.Values.architectures }}
{{- $node := $aff.nodeAffinity | default dict }}
{{- $required := $node.requiredDuringSchedulingIgnoredDuringExecution | default dict }}
{{- $terms := list }}
{{- range ($required.nodeSelectorTerms | default (list dict)) }}
{{- $term := deepCopy . }}
{{- $_ := set $term "matchExpressions" (append ($term.matchExpressions | default list) $arch) }}
{{- $terms = append $terms $term }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $aff "nodeAffinity" $node }}
{{- toYaml $aff }}
{{- end }}

{{/* Restricted Pod Security, container level. */}}
{{- define "fiar.restrictedContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Namespaces the webhooks never see. */}}
{{- define "fiar.webhook.excludedNamespaces" -}}
{{- $ns := list "kube-system" (include "fiar.namespace" .) }}
{{- range .Values.operator.webhook.excludeNamespaces }}{{ $ns = append $ns . }}{{ end }}
{{- toJson (uniq $ns) }}
{{- end }}
