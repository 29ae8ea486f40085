"""Names for MQTT 5 property identifiers and wire types, for code that spells
them out (applications, host tools, tests).

`tern.props` serves every name here as its own attribute (props.USER_PROPERTY,
`from tern.props import TOPIC_ALIAS`) and imports this module only when one is
first asked for: the device path works with the numbers, and 35 module globals
would cost it about 600 bytes of RAM for nothing.
"""

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

# Wire types, as props.prop_type() reports them.
TYPE_BYTE = 1
TYPE_U16 = 2
TYPE_U32 = 3
TYPE_VARINT = 4
TYPE_UTF8 = 5
TYPE_BINARY = 6
TYPE_PAIR = 7

# The packet type props.allowed/encode/decode take for will properties.
WILL = 0
