#!/bin/bash
mv list.txt answer.txt
