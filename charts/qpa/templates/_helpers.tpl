{{/* Names, labels and image references shared by the templates. */}}

{{- define "qpa.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release> when it already contains the chart name, else <release>-qpa; 40 characters at
most so every `<fullname>-<suffix>` stays a DNS label. */}}
{{- define "qpa.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "qpa.operatorName" -}}
{{- printf "%s-operator" (include "qpa.fullname" .) -}}
{{- end -}}

{{- define "qpa.storeName" -}}
{{- printf "%s-store" (include "qpa.fullname" .) -}}
{{- end -}}

{{- define "qpa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "qpa.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "qpa.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "qpa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: qpa
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "qpa.selectorLabels" (list . "operator") */}}
{{- define "qpa.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "qpa.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* An image reference from {repository, tag, digest}: include "qpa.image" (list . .Values.images.sandbox) */}}
{{- define "qpa.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $ref := printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- if $image.digest -}}
{{- $ref = printf "%s@%s" $ref $image.digest -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* The object store endpoint the operator passes on: the bundled store's, else the value. */}}
{{- define "qpa.storeEndpoint" -}}
{{- if .Values.objectStore.bundled.enabled -}}
{{- printf "http://%s.%s.svc.%s:%d" (include "qpa.storeName" .) .Release.Namespace .Values.operator.clusterDomain (int .Values.objectStore.bundled.port) -}}
{{- else -}}
{{- .Values.objectStore.endpoint -}}
{{- end -}}
{{- end -}}

{{/* Pod and container security of every pod of the chart: the `restricted` Pod Security
Standard (non-root, read-only root filesystem, no privilege escalation, all capabilities
dropped, seccomp RuntimeDefault). */}}
{{- define "qpa.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.operator.runAsUser }}
runAsGroup: {{ .Values.operator.runAsUser }}
fsGroup: {{ .Values.operator.runAsUser }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "qpa.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Platform pods prefer nodes that are neither device nor GPU nodes. */}}
{{- define "qpa.platformAffinity" -}}
{{- $terms := list -}}
{{- range $key, $value := merge (dict) .Values.devices.nodeSelector .Values.gpu.nodeSelector -}}
{{- $terms = append $terms (dict "key" $key "operator" "NotIn" "values" (list $value)) -}}
{{- end -}}
{{- if $terms -}}
nodeAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 50
      preference:
        matchExpressions:
          {{- toYaml $terms | nindent 10 }}
{{- end -}}
{{- end -}}

{{/* The Secrets the operator may read (store keys of a namespace), as a JSON array:
objectStore.secretName and objectStore.readableSecrets, each once. */}}
{{- define "qpa.readableSecrets" -}}
{{- $names := list -}}
{{- with .Values.objectStore.secretName -}}
{{- $names = append $names . -}}
{{- end -}}
{{- range .Values.objectStore.readableSecrets -}}
{{- $names = append $names . -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* The operator's network-policy settings (QPA_OPERATOR_NETWORK_POLICY): the values, with the
bundled store's pods added to the in-cluster Services (so its rule names them and its port). */}}
{{- define "qpa.networkPolicy" -}}
{{- $np := deepCopy .Values.networkPolicy -}}
{{- if .Values.objectStore.bundled.enabled -}}
{{- $store := dict "host" (printf "%s.%s" (include "qpa.storeName" .) .Release.Namespace) "podLabels" (include "qpa.selectorLabels" (list . "object-store") | fromYaml) "ports" (list (int .Values.objectStore.bundled.port)) -}}
{{- $_ := set $np.egress "services" (append ($np.egress.services | default list) $store) -}}
{{- end -}}
{{- toJson $np -}}
{{- end -}}
