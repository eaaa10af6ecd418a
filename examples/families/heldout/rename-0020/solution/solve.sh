#!/bin/bash
mv list.txt out.txt
