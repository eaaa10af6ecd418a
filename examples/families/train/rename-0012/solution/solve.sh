#!/bin/bash
mv values.txt result.txt
