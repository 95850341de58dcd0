#!/usr/bin/env python3
"""Generates tests/model/data/chat_templates.json, the chat-template cases of
tests/model/test_chat_template.cpp: jinja2's text for each template, conversation and flag, rendered
as transformers' apply_chat_template(..., tokenize=False) renders it (its own compiled environment:
trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception). Where jinja2 raises, the case
expects an error; so does %-formatting, which twell refuses rather than evaluates.

The templates are written after the shapes of common chat models' (ChatML, Llama 2 and 3, Zephyr,
Gemma, Phi-3, Mistral, Qwen with tools), plus expressions that exercise the evaluator one feature at a
time. Run once, by hand (the C++ tests need no Python):
    pip install transformers jinja2
    python3 tests/model/make_chat_template_fixtures.py
"""
import json
import os

from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "chat_templates.json")


CHATML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
SMOL = """{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""
LLAMA2 = "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
LLAMA3 = """{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"""
ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
GEMMA = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + message['content'] | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %}"""
PHI3 = """{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}"""
MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""
QWEN = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
NS = """{%- set ns = namespace(found=false, last_user=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}{%- set ns.found = true -%}{%- endif -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if not ns.found -%}<sys>default</sys>{%- endif -%}
{%- for m in messages -%}
{%- if m.content is string -%}{{ m.role | upper }}: {{ m.content }}{% if loop.index0 == ns.last_user %} (last){% endif %}
{% else -%}
{%- for part in m.content -%}{% if part.type == 'text' %}{{ part.text }}{% elif part.type == 'image' %}<image>{% endif %}{%- endfor %}
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}ASSISTANT:{% endif -%}"""
MACRO = """{% macro render(m, prefix='> ') -%}
{{ prefix }}{{ m.role }}: {{ m.content | default('(none)') }}
{%- endmacro %}
{% for m in messages %}{{ render(m) }}
{{ render(m, prefix='# ') }}
{% endfor %}"""
TOOLS3 = """{{- bos_token }}
{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""
WS = """  {% if true %}
  x
  {% endif %}
{{- ' y ' -}}  
 z {# c #}
 w
	{%+ if 1 %}a{% endif +%}
b {%- raw %} {{ keep }} {% endraw -%}   c
{% for i in range(3) %}
    {{ i }}
{% endfor %}
{# comment #}
end
"""
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hi, é ünïcode ✓ 😀 "}, {"role": "assistant", "content": "Hello! "}, {"role": "user", "content": "Bye\n\nnow"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "assistant", "content": "x"}],
    [{"role": "system", "content": "S"}],
    [{"role": "user", "content": "What's the weather?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c", "n": 1.5, "ok": True, "none": None}}}]}, {"role": "tool", "content": "{\"t\": 21}"}, {"role": "tool", "content": "more"}, {"role": "user", "content": "thanks"}],
    [{"role": "user", "content": [{"type": "text", "text": "look "}, {"type": "image"}, {"type": "text", "text": " here"}]}],
    # As an OpenAI-style API returns them: null keys, and reasoning under another name.
    [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}, {"role": "tool", "content": "cold", "name": None}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning": "add them", "tool_calls": None}, {"role": "user", "content": "and 3+3?"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather \"now\" <b>", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
EXPRESSIONS = [
 "{{ 'abc'[1:] }}{{ 7 // 2 }}{{ 7 / 2 }}{{ -7 % 3 }}{{ 2 ** 3 }}{{ 1 ~ 2 }}{{ 1.0 }}{{ 1e20 }}{{ 0.1+0.2 }}{{ 1e-5 }}{{ 123456789012345678.0 }}{{ 2.5e-3 }}",
 "{{ x }}|{{ x is defined }}|{{ none }}|{{ [1,'a',none,true,1.5, \"it's\"] }}|{{ {'a':1, 'b': [2]} }}",
 "{{ [1,2] + [3] }} {{ 'a' * 3 }} {{ {'a':1}|tojson }} {{ 'x'|tojson }} {{ [1,{'b':[2,'é\\n\\t\\u0001']}]|tojson(indent=2) }} {{ {'z':1,'a':2}|tojson(sort_keys=true) }} {{ [1,2]|tojson(separators=(',',':')) }}",
 "{{ 'a' in 'cat' }} {{ 1 in [1] }} {{ 'k' in {'k':1} }} {{ not 1 in [2] }} {{ 3 not in [3] }}",
 "{% for a in [1,2] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.length }}-{{ loop.revindex }}-{{ loop.index }}-{{ loop.first }};{% endfor %}",
 "{{ 1 if false }}|{{ (1,2)|list }}|{{ true and 'x' }}|{{ 0 or '' }}|{{ none or [] }}|{{ 'a' if 0 else 'b' }}",
 "{{ 3 < 2.5 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}",
 "{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}",
 "{{ '  x y  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x','c')) }}|{{ 'Hello World'.lower() }}|{{ 'hello world'.title() }}|{{ 'aXa'.replace('a','b') }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'abc'.find('c') }}|{{ '-'.join(['a','b']) }}",
 "{{ [3,1,2]|sort }}|{{ [3,1,2]|sort(reverse=true)|join(',') }}|{{ ['b','A','a']|sort }}|{{ [1,2,3]|first }}{{ [1,2,3]|last }}|{{ 'abc'|length }}{{ [1]|count }}|{{ none|default('d') }}{{ ''|default('e', true) }}{{ x|d('u') }}|{{ [1,1,2]|unique|list }}|{{ [1,2]|reverse|list }}|{{ 'ab'|reverse }}",
 "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|join('/') }}|{{ messages|map(attribute='role')|list }}|{{ messages|selectattr('missing')|list }}",
 "{% for k, v in {'b':1,'a':2}|items %}{{ k }}{{ v }}{% endfor %}|{{ {'b':1,'a':2}.items()|list|length }}|{% for k, v in {'x': 1, 'y': 2}.items() %}{{k}}={{v}},{% endfor %}|{{ {'a':1}.get('a') }}{{ {'a':1}.get('b', 5) }}{{ {'a':1}.get('c') }}",
 "{{ '  hi  '|trim }}|{{ 'hi'|upper }}|{{ 'HI'|lower }}|{{ 'hi there'|capitalize }}|{{ 42|string + '!' }}|{{ '42'|int + 1 }}|{{ '4.5'|float }}|{{ -3|abs }}|{{ 2.567|round(2) }}|{{ 'x<y'|e }}|{{ [1,2,3]|sum }}|{{ [4,2,9]|max }}{{ [4,2,9]|min }}",
 "{{ 'line1\\nline2\\n\\nline4'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}",
 "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}|{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %}",
 "{% set a, b = [1, 2] %}{{ a }}{{ b }}|{% set t %}  block {{ 1 + 1 }} {% endset %}[{{ t }}]|{% set u | trim %}  block  {% endset %}[{{ u }}]",
 "{{ messages[0].content }}{{ messages[-1]['role'] }}{{ messages[5] is defined }}{{ messages[0].nope is defined }}{{ messages|length > 1 }}",
 "{{ x.y }}",
 "{{ x.y.z }}",
 "{{ 'abc'[::-1] }}{{ [1,2,3,4,5][1:4:2] }}{{ 'héllo'[1] }}{{ 'héllo'[-2:] }}{{ 'héllo'|length }}",
 "{{ raise_exception('bad input: ' ~ messages|length) }}",
 "{{ 10 is divisibleby 5 }}{{ 'a' is string }}{{ 1 is number }}{{ none is none }}{{ {} is mapping }}{{ [] is iterable }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}{{ x is undefined }}{{ 'ab' is lower }}{{ 2 is in [1,2] }}{{ 3 is gt 2 }}{{ none is sameas none }}",
 "{{ 'ab' ~ none ~ true ~ 1.0 }}|{{ - 2 + 3 * 4 - 1 }}|{{ 2 ** 3 ** 2 }}|{{ (1 + 2) * 3 }}|{{ 7 % 3 }}{{ 7.5 // 2 }}{{ -7 // 2 }}",
 "{{ 'a' 'b' }}|{{ \"dq 'x'\" }}|{{ 'esc \\' \\\\ \\x41 \\u00e9' }}",
 "{%- if messages -%}\n  yes\n{%- endif %}\n{{ 'after' }}",
 "{{ dict(a=1, b='x') }}|{{ namespace(a=1).a }}|{{ range(2, 10, 3)|list }}",
 "{% macro f(a, b=2) %}{{ a }}+{{ b }}{% endmacro %}{{ f(1) }}|{{ f(1, 3) }}|{{ f(b=5, a=0) }}",
 "{% generation %}gen {{ 1 }}{% endgeneration %}",
 "{{ messages|tojson }}",
 "{{ messages[0]|tojson(indent=2) }}",
 "{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}",
 "{% if messages[0]['content'] is string and messages[0]['content'].split(' ')|length > 1 %}multi{% else %}single{% endif %}",
 "{{ 'x'|unknownfilter }}",
 "{% include 'x' %}",
 "{{ 'a' + 1 }}",
 "{{ undefined_fn() }}",
 "{{ 1/0 }}",
 "{% for x in 5 %}{% endfor %}",
 "{{ '%s' % 1 }}",
 "{{ [1, 2][5] }}|{{ {'a': 1}['b'] }}|{{ 'abc'.upper() }}",
 "{{ messages[0]['content'].count('l') }}{{ 'a b c'.rsplit(' ', 1) }}{{ 'x\\ny'.splitlines() }}",
 "{{ 1 == 1 == 1 }}{{ [1, [2]] == [1, [2]] }}{{ {'a': 1} == {'a': 1.0} }}{{ 'a' != 'b' }}",
 "{{ tools is none }}{{ documents is defined }}{{ add_generation_prompt }}{{ bos_token }}{{ eos_token }}{{ pad_token is defined }}",
 "{{ ['a','b']|join }}{{ [1,2]|join(', ') }}{{ messages|map(attribute='role')|join(', ') }}",
 "{{ 3|float }}{{ 3.7|int }}{{ 'x'|int }}{{ true + 1 }}{{ -0.0 }}{{ 1e16 }}{{ 1e15 }}{{ 0.0001 }}{{ 0.00001 }}",
 "{{ [] | first }}|{{ ([]|first) is defined }}",
 "{{ messages[0]['role'][0]|upper }}{{ messages[0].role[1:] }}",
 # the review's findings, each as jinja2 renders it
 "{% for i in [1,2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}|{% for x in [] %}{% else %}{% set q = 1 %}{% endfor %}[{{ q }}]",
 "{% raw %}\nx{% endraw %}|{% raw -%} x {% endraw %} y|{% raw %}x\n  {% endraw %}y",
 "{{ 2.5|round }} {{ 0.125|round(2) }} {{ 3|round }} {{ 1250|round(-2) }} {{ 2.567|round(2, 'floor') }} {{ 2.561|round(1, 'ceil') }}",
 "{{ ['a','A','b']|unique|list }} {{ ['a','B']|max }} {{ ['b','A']|min }} {{ messages|map(attribute='role')|unique|join(',') }}",
 "{{ \"they're\"|title }} {{ '1st (and) x-y'|title }} {{ \"they're\".title() }} {{ '😀 hi'|upper }}",
 "{{ 'a\n  \nb'|indent(2) }}|{{ ''|indent(2, true) }}|{{ 'a\r\nb\n'|indent(2, blank=true) }}|{{ 'x\ny'|indent('> ') }}",
 "{{ '0x10'|int }} {{ '1_000'|int }} {{ '0x1p3'|float }} {{ ' 12 '|int }} {{ '1e3'|int }} {{ '0x1f'|int(base=16) }} {{ 'inf'|float }} {{ '-1_0.5e1'|float }} {{ 'x'|int(7) }}",
 "{% if [1,2]|select('equalto', 5) %}yes{% endif %}|{{ [1,2]|select('odd')|list }}|{{ [3,1]|reverse|list }}|{{ [1,2,3]|reject('even')|first }}",
 "{{ '123' is lower }} {{ 'abc' is lower }} {{ 'A1' is upper }} {{ {'k': 'v'} is lower }}",
 "{{ 1 // 0.1 }} {{ 1 % 0.1 }} {{ 1e20 % 3.0 }} {{ -7.5 // 2 }} {{ 7 % -3 }} {{ 2 ** -1 }} {{ -7 // 2 }} {{ 10 ** 18 }}",
 "{{ 2.0 ** -24 }} {{ [5.960464477539063e-08] }} {{ 1e22 }} {{ 1e16 }} {{ 123456789012345680.0 }} {{ 0.1 * 3 }}",
 "{{ ['a\u00a0b', '\u200d', 'x\u2028', 'é😀', '\x85'] }}",
 "x\u00a0{%- if true %}y{% endif %}|{% if true -%}\u3000z{% endif %}",
 "{{ 'x' in undefined_var }} {{ undefined_var|length }} {{ 'abc'.foo is defined }} {{ undefined_var is iterable }} {{ messages[0].content.content is defined }}",
 "{{ messages|map(attribute='nope')|join('-') }}|{{ messages|map(attribute='nope', default='d')|list }}",
 "{% for k, v in {'b': 1, 'A': 2}|dictsort %}{{ k }}{{ v }}{% endfor %} {{ [1, 2]|map('tojson', indent=1)|join }} {{ 'a-b'.index('-') }} {{ 'a\nb\r\nc'.splitlines(true) }}",
 "{{ 0x1F + 0o17 + 0b11 }} {{ {'a': [1]}|tojson(indent='\t') }} {{ {'a': [1]}|tojson(indent=0) }}",
 "{{ 2 ** 64 }}",
 "{% endfor %}",
 "{% for x in [1] %}{% endif %}",
 "{% macro m(a=1, b) %}{% endmacro %}",
 "{{ (-9223372036854775807 - 1) // -1 }}",
 "{{ [1,2]|select('odd')|length }}",
 "{{ [1] in {'a': 1} }}",
]

TEMPLATES = [("chatml", CHATML), ("smol", SMOL), ("llama2", LLAMA2), ("llama3", LLAMA3), ("zephyr", ZEPHYR), ("gemma", GEMMA),
             ("phi3", PHI3), ("mistral", MISTRAL), ("qwen", QWEN), ("ns", NS), ("macro", MACRO), ("tools3", TOOLS3), ("ws", WS)]

# twell refuses these where jinja2 renders them (chat_template.h says why).
REFUSED = {"{{ '%s' % 1 }}", "{{ 2 ** 64 }}", "{{ (-9223372036854775807 - 1) // -1 }}"}  # %-format, past 64 bits


def render(template, messages, add_generation_prompt, variables):
    try:
        kwargs = dict(SPECIAL)
        kwargs.update(variables)
        tools, documents = kwargs.pop("tools", None), kwargs.pop("documents", None)
        # apply_chat_template's whole path: the messages normalized (null keys dropped, reasoning aliased)
        rendered, _ = render_jinja_template(conversations=[_normalize_chat_messages(messages)], tools=tools,
                                            documents=documents, chat_template=template,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
        return {"text": rendered[0]}
    except Exception as e:  # noqa: BLE001 - any error jinja2 raises is an expected error
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    cases = []
    for name, template in TEMPLATES:
        uses_tools = "tools" in template
        for ci, conv in enumerate(CONVERSATIONS):
            for agp in (False, True):
                for extra in ({}, {"tools": TOOLS}, {"date_string": "1 Jan 2026", "tools_in_user_message": False,
                                                     "tools": TOOLS})[:3 if uses_tools else 1]:
                    cases.append({"name": f"{name}/c{ci}/agp{int(agp)}/x{len(extra)}", "template": name,
                                  "messages": conv, "add_generation_prompt": agp, "variables": extra,
                                  **render(template, conv, agp, extra)})
    expressions = []
    for i, e in enumerate(EXPRESSIONS):
        for ci in (0, 1):
            case = {"name": f"expr{i}/c{ci}", "template": f"expr{i}", "messages": CONVERSATIONS[ci],
                    "add_generation_prompt": True, "variables": {}}
            case.update({"error": "refused by twell"} if e in REFUSED else render(e, CONVERSATIONS[ci], True, {}))
            cases.append(case)
        expressions.append((f"expr{i}", e))
    out = {"special_tokens": SPECIAL, "templates": dict(TEMPLATES + expressions), "cases": cases}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases, {sum('error' in c for c in cases)} expecting an error")


if __name__ == "__main__":
    main()
