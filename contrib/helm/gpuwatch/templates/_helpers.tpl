{{/*
Names and labels.
*/}}
{{- define "gpuwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwatch.fullname" -}}
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

{{- define "gpuwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuwatch.labels" -}}
{{ include "gpuwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-monitor
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "gpuwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret mounted at /etc/gpuwatch-secrets: the named one, else the chart's (when it has data), else none. */}}
{{- define "gpuwatch.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else if .Values.secrets.data -}}
{{- include "gpuwatch.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* taint.enabled: the DaemonSet's service account and the ClusterRole (and binding) of [actions.taint]. */}}
{{- define "gpuwatch.serviceAccountName" -}}{{ include "gpuwatch.fullname" . }}{{- end -}}
{{- define "gpuwatch.taintRoleName" -}}{{ include "gpuwatch.fullname" . }}-taint{{- end -}}

{{/* Mount points in the container. */}}
{{- define "gpuwatch.configDir" -}}/etc/gpuwatch{{- end -}}
{{- define "gpuwatch.rulesDir" -}}/etc/gpuwatch-rules{{- end -}}
{{- define "gpuwatch.secretsDir" -}}/etc/gpuwatch-secrets{{- end -}}
{{- define "gpuwatch.stateDir" -}}/var/lib/gpuwatch{{- end -}}

{{/*
TOML rendering. Helm reads every YAML number as a float, and gpuwatch refuses `8.0` where it
wants an integer (Sprig's toToml writes exactly that), so values are written here: strings
JSON-quoted (JSON's escapes are TOML's), integral numbers as integers, lists and maps inline.
*/}}
{{- define "gpuwatch.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "gpuwatch.toml.value" -}}
{{- $v := . -}}
{{- $k := kindOf $v -}}
{{- if eq $k "string" -}}
{{- toJson $v -}}
{{- else if eq $k "bool" -}}
{{- ternary "true" "false" $v -}}
{{- else if or (eq $k "float64") (eq $k "float32") -}}
{{- if eq (float64 (int64 $v)) (float64 $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (hasPrefix "int" $k) (hasPrefix "uint" $k) -}}
{{- $v -}}
{{- else if eq $k "slice" -}}
[{{- range $i, $e := $v -}}{{- if $i -}}, {{ end -}}{{- include "gpuwatch.toml.value" $e -}}{{- end -}}]
{{- else if eq $k "map" -}}
{ {{- range $i, $key := keys $v | sortAlpha -}}{{- if $i -}},{{- end }} {{ include "gpuwatch.toml.key" $key }} = {{ include "gpuwatch.toml.value" (get $v $key) -}}{{- end }} }
{{- else -}}
{{- fail (printf "gpuwatch config: a value of kind %s has no TOML form (null? remove the key instead)" $k) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the value is a non-empty list of maps (an array of tables). */}}
{{- define "gpuwatch.toml.isTableArray" -}}
{{- if and (eq (kindOf .) "slice") (gt (len .) 0) -}}
{{- $all := true -}}
{{- range . -}}{{- if ne (kindOf .) "map" -}}{{- $all = false -}}{{- end -}}{{- end -}}
{{- if $all -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The body of table `path` (list PATH MAP): plain keys, then sub-tables [PATH.KEY], then arrays of
tables [[PATH.KEY]]. Keys in `first` (list) come before the others.
*/}}
{{- define "gpuwatch.toml.body" -}}
{{- $path := index . 0 -}}
{{- $t := index . 1 -}}
{{- $first := list -}}
{{- if gt (len .) 2 -}}{{- $first = index . 2 -}}{{- end -}}
{{- $ordered := $first -}}
{{- range $key := keys $t | sortAlpha -}}
{{- if not (has $key $first) -}}{{- $ordered = append $ordered $key -}}{{- end -}}
{{- end -}}
{{- range $key := $ordered -}}
{{- if hasKey $t $key -}}
{{- $v := get $t $key -}}
{{- if not (or (eq (kindOf $v) "map") (include "gpuwatch.toml.isTableArray" $v)) }}
{{ include "gpuwatch.toml.key" $key }} = {{ include "gpuwatch.toml.value" $v }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $key := $ordered -}}
{{- if hasKey $t $key -}}
{{- $v := get $t $key -}}
{{- if eq (kindOf $v) "map" }}

[{{ $path }}.{{ include "gpuwatch.toml.key" $key }}]
{{- include "gpuwatch.toml.body" (list (printf "%s.%s" $path (include "gpuwatch.toml.key" $key)) $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $key := $ordered -}}
{{- if hasKey $t $key -}}
{{- $v := get $t $key -}}
{{- if include "gpuwatch.toml.isTableArray" $v -}}
{{- range $e := $v }}

[[{{ $path }}.{{ include "gpuwatch.toml.key" $key }}]]
{{- include "gpuwatch.toml.body" (list (printf "%s.%s" $path (include "gpuwatch.toml.key" $key)) $e) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
config.toml: the chart's own keys ([daemon] state_dir and rules, [kubernetes], [exporter] listen,
channels with their secret files, routes) and the sections of .Values.config.
*/}}
{{- define "gpuwatch.configToml" -}}
{{- $secretsDir := include "gpuwatch.secretsDir" . -}}
{{- $secretName := include "gpuwatch.secretName" . -}}
{{- $rules := list -}}
{{- if .Values.stockRules.enabled -}}{{- $rules = append $rules .Values.stockRules.path -}}{{- end -}}
{{- if .Values.extraRules -}}{{- $rules = append $rules (include "gpuwatch.rulesDir" .) -}}{{- end -}}
{{- if not $rules -}}
{{- fail "gpuwatch: no rules: keep stockRules.enabled or give extraRules" -}}
{{- end -}}
{{- $config := deepCopy (default dict .Values.config) -}}
{{- $daemon := merge (dict "state_dir" (include "gpuwatch.stateDir" .) "rules" $rules) (default dict (get $config "daemon")) -}}
{{- $_ := unset $config "daemon" -}}
{{- if and (not .Values.kill.enabled) (eq (toString (dig "actions" "kill" "dry_run" true $config)) "false") -}}
{{- fail "gpuwatch: config.actions.kill.dry_run is false but kill.enabled is not: without CAP_KILL no kill of another user's process can succeed" -}}
{{- end -}}
{{- /*
[actions.taint] comes from taint.*, which also gives the pod its service account, token and RBAC;
its other keys (resume, timeout, node …) may come from config.actions.taint. node, api_server,
token_file and ca_file are left to their in-pod defaults: NODE_NAME, KUBERNETES_SERVICE_HOST/PORT
and the mounted token.
*/ -}}
{{- $taint := deepCopy (default dict (dig "actions" "taint" dict $config)) -}}
{{- range $key, $value := dict "enabled" "enabled" "dry_run" "dryRun" "resume_after" "resumeAfter" -}}
{{- if hasKey $taint $key -}}
{{- fail (printf "gpuwatch: config.actions.taint.%s: set taint.%s instead (taint.enabled also adds the service account, its token and the RBAC the action needs)" $key $value) -}}
{{- end -}}
{{- end -}}
{{- if .Values.taint.enabled -}}
{{- $_ := set $taint "enabled" true -}}
{{- $_ := set $taint "dry_run" .Values.taint.dryRun -}}
{{- $_ := set $taint "resume_after" .Values.taint.resumeAfter -}}
{{- $actions := default dict (get $config "actions") -}}
{{- $_ := set $actions "taint" $taint -}}
{{- $_ := set $config "actions" $actions -}}
{{- end -}}
# gpuwatch configuration, rendered by the gpuwatch chart from its values (config, channels,
# routes); every key is documented in config.example.toml.
{{- if $secretName }}
# Secrets are files under {{ $secretsDir }} (the Secret {{ $secretName }}), never values here.
{{- end }}
{{- /* [daemon] first, state_dir and rules leading. */}}

[daemon]
{{- include "gpuwatch.toml.body" (list "daemon" $daemon (list "state_dir" "rules")) }}
{{- range $section := keys $config | sortAlpha }}

[{{ include "gpuwatch.toml.key" $section }}]
{{- include "gpuwatch.toml.body" (list (include "gpuwatch.toml.key" $section) (get $config $section)) }}
{{- end }}


[kubernetes]
pod_resources = {{ ternary "/var/lib/kubelet/pod-resources/kubelet.sock" "" (not (empty .Values.kubelet.podResourcesDir)) | toJson }}
{{- if .Values.exporter.enabled }}

[exporter]
listen = {{ printf "0.0.0.0:%d" (int .Values.exporter.port) | toJson }}
{{- end }}
{{- range $ch := .Values.channels }}
{{- if not (and $ch.name $ch.type) }}
{{- fail (printf "gpuwatch: every channel needs a name and a type: %s" (toJson $ch)) }}
{{- end }}
{{- $plain := omit $ch "secretFiles" }}
{{- range $key, $secretKey := default dict $ch.secretFiles }}
{{- if hasKey $plain $key }}
{{- fail (printf "gpuwatch: channel %q gives %s both inline and in secretFiles" $ch.name $key) }}
{{- end }}
{{- if not $secretName }}
{{- fail (printf "gpuwatch: channel %q reads its %s from the Secret key %q: set secrets.existingSecret, or secrets.data.%s" $ch.name $key $secretKey $secretKey) }}
{{- end }}
{{- if and (not $.Values.secrets.existingSecret) (not (hasKey $.Values.secrets.data $secretKey)) }}
{{- fail (printf "gpuwatch: channel %q reads its %s from the Secret key %q, which secrets.data does not have" $ch.name $key $secretKey) }}
{{- end }}
{{- $_ := set $plain (printf "%s_file" $key) (printf "%s/%s" $secretsDir $secretKey) }}
{{- end }}

[[channel]]
{{- include "gpuwatch.toml.body" (list "channel" $plain (list "name" "type")) }}
{{- end }}
{{- range $route := .Values.routes }}

[[route]]
{{- include "gpuwatch.toml.body" (list "route" $route) }}
{{- end }}
{{ end -}}
