{{/* Names and labels shared by every template. */}}

{{- define "hamid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hamid.fullname" -}}
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

{{/* The labels that select the daemon's pods (the daemon's daemonPodSelector is built from them). */}}
{{- define "hamid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hamid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hamid.labels" -}}
{{ include "hamid.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "hamid.serviceAccountName" -}}
{{- default (include "hamid.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "hamid.webhookService" -}}
{{- printf "%s-webhook" (include "hamid.fullname" .) -}}
{{- end -}}

{{- define "hamid.gossipSecret" -}}
{{- default (printf "%s-gossip" (include "hamid.fullname" .)) .Values.gossip.existingSecret -}}
{{- end -}}

{{- define "hamid.webSecret" -}}
{{- default (printf "%s-web" (include "hamid.fullname" .)) .Values.web.existingSecret -}}
{{- end -}}

{{- define "hamid.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "hamid.fullname" .)) .Values.webhook.certificate.existingSecret -}}
{{- end -}}

{{/* The GPU resource names pods ask with (config keys, HAMi's defaults). */}}
{{- define "hamid.resourceNames" -}}
{{- $c := .Values.config -}}
{{- list (default "nvidia.com/gpu" $c.resourceCountName) (default "nvidia.com/gpumem" $c.resourceMemoryName) (default "nvidia.com/gpumem-percentage" $c.resourceMemoryPercentageName) (default "nvidia.com/gpucores" $c.resourceCoreName) (default "nvidia.com/priority" $c.resourcePriorityName) | toJson -}}
{{- end -}}

{{/* The namespaces neither the webhook nor the admission policy looks at. */}}
{{- define "hamid.excludedNamespaces" -}}
{{- append .Values.webhook.excludeNamespaces .Release.Namespace | uniq | toJson -}}
{{- end -}}

{{/* The config file `hamid run --config` reads: the operator's keys plus the chart's own. */}}
{{- define "hamid.config" -}}
{{- $owned := dict
      "kubernetes" true
      "controlMode" .Values.mode
      "stateDir" .Values.hostPaths.state
      "kubeletDir" .Values.hostPaths.kubelet
      "cdiSpecDir" .Values.hostPaths.cdi
      "metricsPort" (int .Values.ports.metrics)
      "metricsAddress" "0.0.0.0"
      "frontDir" "/run/hamid-front"
      "frontGroup" 65534
      "gossipListen" (printf "0.0.0.0:%d" (int .Values.ports.gossip))
      "gossipKeyFile" "/etc/hamid/gossip/gossip.keys"
      "peerListen" (printf "0.0.0.0:%d" (int .Values.ports.peer))
      "extenderListen" (printf "0.0.0.0:%d" (int .Values.ports.extender))
      "daemonPodSelector" (printf "app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s" (include "hamid.name" .) .Release.Name)
      "leaderElectionLeaseName" (printf "%s-leader" (include "hamid.fullname" .)) -}}
{{- if .Values.web.enabled -}}
{{- $_ := set $owned "webListen" (printf "0.0.0.0:%d" (int .Values.ports.web)) -}}
{{- $_ := set $owned "webTokenFile" "/etc/hamid/web/token" -}}
{{- end -}}
{{- if ne .Values.mode "none" -}}
{{- $_ := set $owned "webhookListen" (printf "0.0.0.0:%d" (int .Values.ports.webhook)) -}}
{{- $_ := set $owned "webhookCertFile" "/etc/hamid/webhook-tls/tls.crt" -}}
{{- $_ := set $owned "webhookKeyFile" "/etc/hamid/webhook-tls/tls.key" -}}
{{- end -}}
{{- if eq .Values.mode "extender" -}}
{{- $_ := set $owned "extenderClientCAFile" "/etc/hamid/extender-client/ca.crt" -}}
{{- $_ := set $owned "extenderClientCertFile" "/etc/hamid/extender-client/tls.crt" -}}
{{- $_ := set $owned "extenderClientKeyFile" "/etc/hamid/extender-client/tls.key" -}}
{{- $_ := set $owned "extenderServerCAFile" "/etc/hamid/webhook-tls/ca.crt" -}}
{{- end -}}
{{- $dra := ternary .Values.config.draDevices "" (hasKey .Values.config "draDevices") -}}
{{- range (.Values.config.nodeconfig | default list) -}}{{- if .draDevices -}}{{- $dra = .draDevices -}}{{- end -}}{{- end -}}
{{- if and $dra (not .Values.dra.enabled) -}}
{{- fail "config.draDevices is set but dra.enabled is false: kubelet's plugin directories would not be mounted nor the ResourceSlice access granted; set dra.enabled: true" -}}
{{- end -}}
{{- range $k, $_ := $owned -}}
{{- if hasKey $.Values.config $k -}}
{{- fail (printf "config.%s is set by the chart (from mode, ports, hostPaths or the Secrets); remove it from config and set the chart value instead" $k) -}}
{{- end -}}
{{- end -}}
{{- toYaml (merge (deepCopy .Values.config) $owned) -}}
{{- end -}}
