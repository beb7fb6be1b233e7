"""Small chat templates in the shape of real tool-calling families (written for the tests, not
copied from any model), shared by the tool-call and server tests."""

HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>
{% endif %}{%- for message in messages %}{% if message.role == 'system' and tools %}{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3_TEMPLATE = """{% for message in messages %}{% if message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>{% elif message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for call in message.tool_calls %}{"name": "{{ call.function.name }}", "parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eot_id|>{% else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{% if loop.first and tools %}Tools:{% for t in tools %} {{ t | tojson }}{% endfor %} (call with <|python_tag|>)
{% endif %}{{ message.content }}<|eot_id|>{% endif %}{% endfor %}<|start_header_id|>assistant<|end_header_id|>

"""

MISTRAL_TEMPLATE = """{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}{% for message in messages %}{% if message.role == 'user' %}[INST]{{ message.content }}[/INST]{% elif message.tool_calls %}[TOOL_CALLS]{{ message.tool_calls | tojson }}</s>{% elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.content }}[/TOOL_RESULTS]{% else %}{{ message.content }}</s>{% endif %}{% endfor %}"""
